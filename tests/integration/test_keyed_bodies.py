"""A keyed request's body, read before anything is claimed, by the Idempotency-Key middleware
and the idempotency proxy alike: over the limit it is refused with 413 before the rest is read;
a client that leaves mid-body gets no answer; neither claims a key or reaches the endpoint or
the upstream."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from receiver import IdempotencyKeyMiddleware, IdempotencyProxy, SQLiteStore
from receiver._idempotency.body import BodyTooLarge, ClientGone, read_body

ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]


def scope(path: str = "/payments") -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"idempotency-key", b'"k-1"'), (b"authorization", b"Bearer t")],
        "client": ("127.0.0.1", 40000),
        "server": ("api.test", 80),
    }


def messages(*chunks: bytes, disconnect: bool = False) -> Receive:
    pending: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1 or disconnect}
        for i, chunk in enumerate(chunks)
    ]
    if disconnect:
        pending.append({"type": "http.disconnect"})
    read: list[Message] = []

    async def receive() -> Message:
        message = pending.pop(0) if pending else {"type": "http.disconnect"}
        read.append(message)
        return message

    receive.read = read  # type: ignore[attr-defined]
    return receive


async def run(app: ASGI, receive: Receive) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope(), receive, send)
    return sent


async def test_read_body_joins_chunks_and_stops_at_the_limit() -> None:
    assert await read_body(messages(b"ab", b"cd", b"e"), 5) == b"abcde"
    too_large = messages(b"abc", b"def", b"never read")
    with pytest.raises(BodyTooLarge):
        await read_body(too_large, 5)
    assert len(too_large.read) == 2  # type: ignore[attr-defined]
    with pytest.raises(ClientGone):
        await read_body(messages(b"ab", disconnect=True), 5)


async def keys_in(store: SQLiteStore) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM receiver_receipts"))


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    opened = SQLiteStore(tmp_path / "keys.db")
    await opened.open()
    yield opened
    await opened.close()


async def test_the_middleware_refuses_a_large_body_and_ignores_a_client_that_left(
    store: SQLiteStore,
) -> None:
    reached: list[Scope] = []

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope)

    app = IdempotencyKeyMiddleware(
        endpoint, store=store, principal=lambda scope: "tenant", max_body_size=4
    )
    sent = await run(app, messages(b"abc", b"defg"))
    assert sent[0]["status"] == 413
    assert await run(app, messages(b"ab", disconnect=True)) == []
    assert reached == []
    assert await keys_in(store) == 0


async def test_the_proxy_refuses_a_large_body_and_ignores_a_client_that_left(
    store: SQLiteStore,
) -> None:
    # Nothing listens on port 9: a request that reached the forwarding step would fail there.
    proxy = IdempotencyProxy("http://127.0.0.1:9", store=store, max_body_size=4)
    sent = await run(proxy, messages(b"abc", b"defg"))
    assert sent[0]["status"] == 413
    assert await run(proxy, messages(b"ab", disconnect=True)) == []
    assert await keys_in(store) == 0


async def test_a_principal_that_names_nobody_is_refused_before_anything_is_stored(
    store: SQLiteStore,
) -> None:
    """Keyed under str(None), every anonymous client would share keys (and see each other's
    answers); under an object's repr, no retry would ever match."""
    reached: list[Scope] = []

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope)

    for who in (None, "", object()):
        app = IdempotencyKeyMiddleware(endpoint, store=store, principal=lambda scope, w=who: w)
        sent = await run(app, messages(b"{}"))
        assert sent[0]["status"] == 500
        assert b"no-principal" in sent[1]["body"]
    assert reached == []
    assert await keys_in(store) == 0
