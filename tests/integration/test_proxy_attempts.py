"""What ``reconcile(attempt)`` is told about the attempt it settles: how it ended (a timeout, a
lost connection, the upstream's 5xx, a proxy that stopped) and when it was forwarded, by the
ledger's clock, through a client's retry and through the sweeper, and still after a reconcile
that raised; a request forwarded again after RUN_AGAIN is an attempt of its own. The proxy runs
on uvicorn in front of a real upstream on loopback, on each store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from receiver import RUN_AGAIN, IdempotencyProxy, ProxyAttempt, Store
from tests.integration.test_proxy_framing import on_loopback


class Upstream:
    """Answers each POST /orders as ``script`` says, in turn: (seconds to take, status)."""

    def __init__(self, *script: tuple[float, int]) -> None:
        self.script = list(script)
        self.app = Starlette(routes=[Route("/orders", self.orders, methods=["POST"])])

    async def orders(self, request: Request) -> Response:
        seconds, status = self.script.pop(0)
        await asyncio.sleep(seconds)
        return Response(b'{"id":"o_1"}', status)


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads a request, then closes the connection without a word."""
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


class Recorder:
    """A reconcile that keeps every attempt it is given and answers from ``answers`` in turn (an
    exception is raised)."""

    def __init__(self, *answers: Any) -> None:
        self.seen: list[ProxyAttempt] = []
        self.answers = list(answers)

    async def reconcile(self, attempt: ProxyAttempt) -> Any:
        self.seen.append(attempt)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


FOUND = Response(b'{"id":"o_1"}', 201)


@asynccontextmanager
async def proxied(
    store: Store, upstream: Upstream | str, reconcile: Recorder
) -> AsyncIterator[tuple[IdempotencyProxy, httpx.AsyncClient]]:
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(upstream, Upstream):
            upstream = (
                f"http://127.0.0.1:{await stack.enter_async_context(on_loopback(upstream.app))}"
            )
        proxy = IdempotencyProxy(
            upstream,
            store=store,
            reconcile=reconcile.reconcile,
            timeout=0.3,
            lease=5,
            sweep_interval=None,
        )
        try:
            port = await stack.enter_async_context(on_loopback(proxy))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                yield proxy, client
        finally:
            await proxy.aclose()


async def order(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/orders", content=b"{}", headers={"idempotency-key": "k"})


@pytest.mark.parametrize(
    ("answer", "status", "interruption", "upstream_status"),
    [
        ((1.0, 201), 504, "timeout", None),
        ((0.0, 500), 500, "upstream_error", 500),
        ((0.0, 502), 502, "upstream_error", 502),
    ],
)
async def test_a_retry_tells_reconcile_how_the_attempt_ended_and_when_it_began(
    store: Store,
    answer: tuple[float, int],
    status: int,
    interruption: str,
    upstream_status: int | None,
) -> None:
    reconcile = Recorder(FOUND)
    async with proxied(store, Upstream(answer), reconcile) as (_, client):
        before = time.time()
        assert (await order(client)).status_code == status
        await asyncio.sleep(0.2)
        assert (await order(client)).status_code == 201
        after = time.time()
    [attempt] = reconcile.seen
    assert (attempt.interruption, attempt.status) == (interruption, upstream_status)
    assert before - 0.05 <= attempt.began <= before + 0.3
    assert 0.2 <= attempt.age <= after - before + 0.05


async def test_a_connection_lost_after_sending(store: Store) -> None:
    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    reconcile = Recorder(FOUND)
    try:
        async with proxied(store, url, reconcile) as (_, client):
            assert (await order(client)).status_code == 502
            assert (await order(client)).status_code == 201
    finally:
        server.close()
        await server.wait_closed()
    assert [(a.interruption, a.status) for a in reconcile.seen] == [("connection_lost", None)]


async def test_a_proxy_that_failed_after_the_upstream_answered(store: Store) -> None:
    reconcile = Recorder(FOUND)
    async with proxied(store, Upstream((0.0, 201)), reconcile) as (proxy, client):
        forward = proxy.app

        async def fails_after(scope: Scope, receive: Receive, send: Send) -> None:
            await forward(scope, receive, send)
            raise RuntimeError("the proxy failed before storing the answer")

        proxy.app = fails_after
        assert (await order(client)).status_code == 502
        proxy.app = forward
        assert (await order(client)).status_code == 201
    assert [(a.interruption, a.status) for a in reconcile.seen] == [("proxy_stopped", None)]


async def test_a_reconcile_that_raised_leaves_the_attempt_as_it_was(store: Store) -> None:
    """The next reconcile, by a retry or the sweeper, is told of the same attempt, older."""
    reconcile = Recorder(RuntimeError("lookup down"), RuntimeError("lookup down"), FOUND)
    async with proxied(store, Upstream((1.0, 201)), reconcile) as (proxy, client):
        assert (await order(client)).status_code == 504
        assert (await order(client)).status_code == 502  # reconcile raised
        await asyncio.sleep(0.2)
        report = await proxy.sweep()  # raised again
        await asyncio.sleep(0.2)
        assert (await order(client)).status_code == 201
    assert report.recovered == 0
    first, swept, last = reconcile.seen
    assert {a.interruption for a in reconcile.seen} == {"timeout"}
    assert first.began == swept.began == last.began
    assert first.age < swept.age < last.age


async def test_a_request_forwarded_again_is_an_attempt_of_its_own(store: Store) -> None:
    reconcile = Recorder(RUN_AGAIN, FOUND)
    upstream = Upstream((0.0, 500), (1.0, 201))
    async with proxied(store, upstream, reconcile) as (_, client):
        assert (await order(client)).status_code == 500
        await asyncio.sleep(0.2)
        # Reconciled as not done, forwarded again, and this time no answer in time.
        assert (await order(client)).status_code == 504
        assert (await order(client)).status_code == 201
    assert upstream.script == []
    (failed, slow) = reconcile.seen
    assert (failed.interruption, failed.status) == ("upstream_error", 500)
    assert (slow.interruption, slow.status) == ("timeout", None)
    assert slow.began >= failed.began + failed.age  # claimed when it was forwarded again
    assert slow.age < 1
