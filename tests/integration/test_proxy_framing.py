"""What the upstream gets over the wire from the idempotency proxy, served by uvicorn on loopback,
in front of an HTTP/1.1 upstream (h11 on loopback) that records each request's header fields and
body as they arrived; the clients write their requests byte for byte.

The body is framed as the client framed it: none for a GET, HEAD or DELETE without one (never an
empty chunked body), the client's Content-Length, or chunked. And the forwarding headers say
what the proxy saw: a client's X-Forwarded-Host, -Proto and -For (and Forwarded, X-Real-IP) are
replaced, unless the client is one of the configured trusted proxies.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
import uvicorn

from receiver import IdempotencyProxy, SQLiteStore

CLIENT = "127.0.0.2"  # a client of its own loopback address, not a trusted proxy
GATEWAY = "127.0.0.3"  # a trusted proxy in front of this one


@dataclass
class Seen:
    method: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def get(self, name: bytes) -> list[bytes]:
        return [v for n, v in self.headers if n == name]


@dataclass
class Upstream:
    """Records every request as h11 parsed it off the wire (names lowercased, values as sent)."""

    port: int = 0
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Request):
                    request, body = event, b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert request is not None
                    self.seen.append(Seen(request.method, list(request.headers), body))
                    head = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
                    writer.write(conn.send(h11.Response(status_code=200, headers=head)) or b"")
                    if request.method != b"HEAD":
                        writer.write(conn.send(h11.Data(data=b"ok")) or b"")
                    writer.write(conn.send(h11.EndOfMessage()) or b"")
                    await writer.drain()
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                else:  # ConnectionClosed, or a PAUSED connection
                    return
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    try:
        yield up
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def on_loopback(app: Any) -> AsyncIterator[int]:
    """An ASGI app on uvicorn in this event loop, on a free loopback port (yielded), its
    proxy-header handling off as ``receiver proxy`` runs it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", proxy_headers=False, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):  # at most 10 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.02)
        assert server.started, "the server did not start"
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def served(tmp_path: Path, up: Upstream, **options: Any) -> AsyncIterator[int]:
    """The proxy in front of ``up``: the proxy alone decides which forwarding headers to
    believe."""
    store = SQLiteStore(tmp_path / "proxy.db")
    await store.open()
    proxy = IdempotencyProxy(
        f"http://127.0.0.1:{up.port}", store=store, sweep_interval=None, **options
    )
    try:
        async with on_loopback(proxy) as port:
            yield port
    finally:
        await proxy.aclose()
        await store.close()


async def send_raw(port: int, request: bytes, source: str = CLIENT) -> bytes:
    """One request, written as given, from ``source``; the whole answer (the server closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def head(method: str, path: str, *fields: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: api.test", "Connection: close", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE"])
async def test_a_request_without_a_body_reaches_the_upstream_without_one(
    tmp_path: Path, method: str
) -> None:
    async with upstream() as up, served(tmp_path, up) as port:
        answer = await send_raw(port, head(method, "/v1/orders/7"))
    assert answer.startswith(b"HTTP/1.1 200"), answer
    [seen] = up.seen
    assert seen.method == method.encode()
    assert seen.get(b"transfer-encoding") == []
    assert seen.get(b"content-length") == []
    assert seen.body == b""


async def test_a_sized_body_keeps_its_content_length_and_a_chunked_one_stays_chunked(
    tmp_path: Path,
) -> None:
    sized = head("POST", "/v1/notes", "Content-Length: 11") + b"hello there"
    chunked = head("PUT", "/v1/notes", "Transfer-Encoding: chunked")
    chunked += b"5\r\nhello\r\n6\r\n there\r\n0\r\n\r\n"
    keyed = head("POST", "/v1/payments", "Content-Length: 2", 'Idempotency-Key: "k-1"') + b"{}"
    async with upstream() as up, served(tmp_path, up) as port:
        for request in (sized, chunked, keyed):
            answer = await send_raw(port, request)
            assert answer.startswith(b"HTTP/1.1 200"), answer
    passed, streamed, forwarded = up.seen
    assert (passed.get(b"content-length"), passed.get(b"transfer-encoding")) == ([b"11"], [])
    assert passed.body == b"hello there"
    assert (streamed.get(b"content-length"), streamed.get(b"transfer-encoding")) == (
        [],
        [b"chunked"],
    )
    assert streamed.body == b"hello there"
    assert (forwarded.get(b"content-length"), forwarded.get(b"transfer-encoding")) == ([b"2"], [])
    assert forwarded.body == b"{}"


CLAIMS = (
    "X-Forwarded-Host: bank.example",
    "X-Forwarded-Proto: https",
    "X-Forwarded-For: 203.0.113.9",
    "X-Forwarded-Port: 443",
    "Forwarded: for=203.0.113.9;host=bank.example;proto=https",
    "X-Real-IP: 203.0.113.9",
)


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("trusted", [(), (GATEWAY,)])
async def test_a_client_that_is_no_trusted_proxy_cannot_claim_a_host_or_a_scheme(
    tmp_path: Path, keyed: bool, trusted: tuple[str, ...]
) -> None:
    key = ('Idempotency-Key: "k-2"',) if keyed else ()
    request = head("POST", "/v1/payments", "Content-Length: 2", *key, *CLAIMS) + b"{}"
    async with upstream() as up, served(tmp_path, up, trusted_proxies=trusted) as port:
        answer = await send_raw(port, request, source=CLIENT)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    [seen] = up.seen
    # What the proxy saw: the Host it was called by, plain HTTP, the TCP peer.
    assert seen.get(b"x-forwarded-host") == [b"api.test"]
    assert seen.get(b"x-forwarded-proto") == [b"http"]
    assert seen.get(b"x-forwarded-for") == [CLIENT.encode()]
    for name in (b"x-forwarded-port", b"forwarded", b"x-real-ip"):
        assert seen.get(name) == [], name


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_trusted_proxys_forwarding_headers_are_passed_on(
    tmp_path: Path, keyed: bool
) -> None:
    key = ('Idempotency-Key: "k-3"',) if keyed else ()
    request = head("POST", "/v1/payments", "Content-Length: 2", *key, *CLAIMS) + b"{}"
    async with upstream() as up, served(tmp_path, up, trusted_proxies=[GATEWAY]) as port:
        answer = await send_raw(port, request, source=GATEWAY)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    [seen] = up.seen
    assert seen.get(b"x-forwarded-host") == [b"bank.example"]
    assert seen.get(b"x-forwarded-proto") == [b"https"]
    # The gateway's chain, and the gateway itself as the hop this proxy saw.
    assert seen.get(b"x-forwarded-for") == [f"203.0.113.9, {GATEWAY}".encode()]
    assert seen.get(b"forwarded") == [b"for=203.0.113.9;host=bank.example;proto=https"]


async def test_a_trusted_proxy_that_sent_no_host_or_scheme_gets_what_this_proxy_saw(
    tmp_path: Path,
) -> None:
    async with upstream() as up, served(tmp_path, up, trusted_proxies=[GATEWAY]) as port:
        await send_raw(port, head("GET", "/v1/orders/7"), source=GATEWAY)
    [seen] = up.seen
    assert seen.get(b"x-forwarded-host") == [b"api.test"]
    assert seen.get(b"x-forwarded-proto") == [b"http"]
    assert seen.get(b"x-forwarded-for") == [GATEWAY.encode()]
