"""A handler's (or a keyed endpoint's) answer that HTTP cannot carry as it would be stored is
refused before anything commits: an informational status (1xx), a body on a 204 or a 304, a
stream.

Stored, such an answer completed the receipt and every redelivery got it again; a real server
(uvicorn, on h11 and httptools alike) then failed the answer and broke the connection, each
time, for the whole window, though the handler's effects had committed. Refused, it is the
handler's failure: 500, the handler's write rolled back, the receipt released for the sender's
retry, and the reason kept; a handler with external effects is held for review instead (its
effect happened, and a retry would repeat it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from receiver import Connection, Event, IdempotencyKeyMiddleware, Store, idempotent_request
from receiver._ledger.receipts import State
from tests.integration.test_handler_failures import deliver, receipt, receiver_on
from tests.support import EFFECTS_DDL, Clock, effects, write_effect


async def _chunks() -> AsyncIterator[bytes]:
    yield b"ok"


UNSENDABLE: dict[str, tuple[Any, str]] = {
    "switching protocols": (
        lambda: Response(status_code=101),
        "its status is 200 or more, not 101",
    ),
    "early hints": (lambda: Response(b"hints", status_code=103), "not 103"),
    "204 with a body": (
        lambda: Response(b"done", status_code=204),
        "a 204 answer carries no body: send it without content",
    ),
    "304 with a body": (lambda: Response(b"same", status_code=304), "a 304 answer carries no body"),
    "a stream": (lambda: StreamingResponse(_chunks()), "a stream cannot be stored"),
}


@pytest.mark.parametrize("case", sorted(UNSENDABLE))
async def test_an_answer_http_cannot_carry_is_refused_and_rolled_back(
    store: Store, case: str
) -> None:
    make, says = UNSENDABLE[case]
    clock = Clock()
    rx = receiver_on(store, clock)

    @rx.on("order.created")
    async def handler(event: Event, tx: Connection) -> Any:
        await write_effect(tx, event.provider, event.id, event.fence)
        return make()

    await rx.open()
    try:
        response = await deliver(rx, clock)
        assert response.status_code == 500, response.text
        assert response.json()["error"] == "handler_failed"
        assert await effects(store) == 0
        found = await receipt(store)
        assert found.state is State.RELEASED
        assert found.last_error is not None
        assert found.last_error.startswith("NotStorable: ")
        assert says in found.last_error
    finally:
        await rx.close()


async def test_an_external_handler_s_unsendable_answer_is_held_for_review(store: Store) -> None:
    clock = Clock()
    rx = receiver_on(store, clock)
    calls = 0

    @rx.on("order.created", effects="external")
    async def handler(event: Event, tx: Connection) -> Response:
        nonlocal calls
        calls += 1
        return Response(b"charged", status_code=204)

    await rx.open()
    try:
        first = await deliver(rx, clock)
        assert first.status_code == 202, first.text
        assert first.json()["status"] == "needs_review"
        found = await receipt(store)
        assert found.state is State.FAILED
        assert found.last_error is not None
        assert "Response 204 with a body, which cannot be stored" in found.last_error
        # The retry does not call the partner again: the receipt waits for an operator.
        again = await deliver(rx, clock)
        assert (again.status_code, again.content) == (202, first.content)
        assert calls == 1
    finally:
        await rx.close()


@pytest.mark.parametrize("status", [204, 304])
async def test_an_empty_204_or_304_is_stored_and_replayed(store: Store, status: int) -> None:
    clock = Clock()
    rx = receiver_on(store, clock)

    @rx.on("order.created")
    async def handler(event: Event, tx: Connection) -> Response:
        return Response(status_code=status, headers={"x-order": "o-1"})

    await rx.open()
    try:
        first = await deliver(rx, clock)
        again = await deliver(rx, clock)
        for answer in (first, again):
            assert answer.status_code == status
            assert answer.content == b""
            assert answer.headers["x-order"] == "o-1"
        assert again.headers["idempotent-replayed"] == "true"
        assert (await receipt(store)).state is State.COMPLETED
    finally:
        await rx.close()


@pytest.mark.parametrize(("status", "body"), [(204, b"refunded"), (304, b"same"), (103, b"")])
async def test_the_middleware_stores_no_answer_http_cannot_carry(
    store: Store, status: int, body: bytes
) -> None:
    """The endpoint's answer goes out as it came (the server fails it, as it would without the
    middleware), its writes roll back and the key is given back: the client's retry runs it
    again instead of getting a replay that fails the same way until the key expires."""
    runs = 0

    async def refund(request: Request) -> Response:
        nonlocal runs
        runs += 1
        keyed = idempotent_request(request)
        assert keyed is not None
        await write_effect(keyed.tx, keyed.principal, keyed.key, keyed.fence)
        return Response(body, status)

    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    app = Starlette(
        routes=[Route("/refunds", refund, methods=["POST"])],
        middleware=[Middleware(IdempotencyKeyMiddleware, store=store, principal=lambda s: "t")],
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for _ in range(2):
            answer = await client.post(
                "/refunds", content=b"{}", headers={"idempotency-key": '"r-1"'}
            )
            assert answer.status_code == status
            assert "idempotent-replayed" not in answer.headers
    assert runs == 2
    assert await effects(store) == 0
    async with store.acquire() as conn:
        assert await conn.fetchval("SELECT state FROM receiver_receipts") == "released"
