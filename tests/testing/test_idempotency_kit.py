"""The kit drives a user's own ASGI app behind the Idempotency-Key middleware, on both stores
(Starlette, and FastAPI where the stack differs): a client retrying with the same key,
concurrent copies, a dropped connection, a body re-serialized by another client library, a
crash before the answer is stored; and random retries of all of these checked against the
user's invariant ("one payment row per key"), where an endpoint that writes outside the
ledger's transaction fails, shrunk to the one step that shows it."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Scope

from receiver import (
    ConfigurationError,
    Connection,
    IdempotencyKeyMiddleware,
    PostgresStore,
    SQLiteStore,
    Store,
    idempotent_request,
)
from receiver.testing import (
    STYLES,
    Client,
    FakeClock,
    Fault,
    TestStores,
    assert_count,
    assert_executed_once,
    assert_replayed,
    check_answers,
    check_requests,
    count,
    reserialize,
)

LEASE = 30.0
TENANT = {"x-tenant": "t-1"}
DDL = "CREATE TABLE IF NOT EXISTS kit_payments (idem_key TEXT NOT NULL, amount INTEGER NOT NULL)"
PAYMENTS = "SELECT count(*) FROM kit_payments WHERE idem_key = $1"
CALLS = [
    ("POST", "/payments", {"amount": 1200, "note": "Café, table 4", "items": [{"sku": "a"}]}),
    ("POST", "/payments", {"amount": 800, "note": "second"}),
]


def tenant(scope: Scope) -> str:
    return Headers(scope=scope).get("x-tenant", "anonymous")


def _sqlite_write(path: str, sql: str, args: tuple[Any, ...]) -> None:
    db = sqlite3.connect(path, timeout=10)
    try:
        db.execute(sql, args)
        db.commit()
    finally:
        db.close()


async def outside(store: Store, key: str, amount: int) -> None:
    """The bug: the payment row goes in on a connection of the endpoint's own, so it commits
    at once, whatever becomes of the request."""
    if isinstance(store, SQLiteStore):
        # In a thread: the store's connection may hold the write lock for a group commit that
        # only the event loop can finish.
        insert = "INSERT INTO kit_payments (idem_key, amount) VALUES (?, ?)"
        await asyncio.to_thread(_sqlite_write, store.path, insert, (key, amount))
        return
    assert isinstance(store, PostgresStore)
    conn = await asyncpg.connect(store._dsn)
    try:
        await conn.execute(
            "INSERT INTO kit_payments (idem_key, amount) VALUES ($1, $2)", key, amount
        )
    finally:
        await conn.close()


def shop(
    *, broken: bool = False, framework: str = "starlette", wait: float = 0.0, slow: float = 0.0
) -> Callable[[Store, FakeClock], ASGIApp]:
    """The user's app factory: POST /payments writes one payment row through the ledger's
    transaction (or, when ``broken``, on a connection of its own) and answers 201, after
    ``slow`` seconds of work."""

    def build(store: Store, clock: FakeClock) -> ASGIApp:
        async def pay(request: Request) -> Response:
            body = await request.json()
            await asyncio.sleep(slow)
            keyed = idempotent_request(request)
            assert keyed is not None
            if broken:
                await outside(store, keyed.key, body["amount"])
            else:
                await keyed.tx.execute(
                    "INSERT INTO kit_payments (idem_key, amount) VALUES ($1, $2)",
                    keyed.key,
                    body["amount"],
                )
            answer = {"paid": body["amount"], "fence": keyed.fence}
            return JSONResponse(answer, 201, headers={"location": f"/payments/{keyed.key}"})

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            async with store.acquire() as conn:
                await conn.execute(DDL)
            yield

        if framework == "asgi":  # the middleware wrapped around the app by hand
            inner = Starlette(routes=[Route("/payments", pay, methods=["POST"])], lifespan=lifespan)
            return IdempotencyKeyMiddleware(
                inner,
                store=store,
                principal=tenant,
                required=["/payments"],
                lease=LEASE,
                wait=wait,
                sweep_interval=None,
            )
        middleware = Middleware(
            IdempotencyKeyMiddleware,
            store=store,
            principal=tenant,
            required=["/payments"],
            lease=LEASE,
            wait=wait,
            sweep_interval=None,
        )
        if framework == "fastapi":
            app = FastAPI(middleware=[middleware], lifespan=lifespan)
            app.add_api_route("/payments", pay, methods=["POST"])
            return app
        return Starlette(
            routes=[Route("/payments", pay, methods=["POST"])],
            middleware=[middleware],
            lifespan=lifespan,
        )

    return build


async def at_most_one_payment_per_key(conn: Connection) -> None:
    rows = await conn.fetch(
        "SELECT idem_key, count(*) AS n FROM kit_payments GROUP BY idem_key HAVING count(*) > 1"
    )
    assert not rows, f"charged twice: {len(rows)} key(s)"


async def one_payment_per_request(conn: Connection) -> None:
    await at_most_one_payment_per_key(conn)
    assert await count(conn, "SELECT count(*) FROM kit_payments") == len(CALLS), "unpaid"


async def test_a_client_retrying_with_the_same_key_gets_the_stored_answer(
    kit_stores: TestStores,
) -> None:
    clock = FakeClock()
    async with (
        await kit_stores.fresh(clock) as store,
        Client(shop()(store, clock), headers=TENANT) as client,
    ):
        pay = client.request("/payments", CALLS[0][2])
        first, again = await client.send(pay), await client.send(pay)
        assert (first.outcome, first.status) == ("executed", 201), first
        assert_replayed(first, [again])
        assert again.header("location") == f"/payments/{pay.key}"
        await assert_count(store, 1, PAYMENTS, pay.key)


@pytest.mark.parametrize("framework", ["starlette", "fastapi", "asgi"])
@pytest.mark.parametrize("wait", [0.0, 5.0])
async def test_concurrent_copies_run_once(
    kit_stores: TestStores, framework: str, wait: float
) -> None:
    clock = FakeClock()
    async with await kit_stores.fresh(clock) as store:
        app = shop(framework=framework, wait=wait)(store, clock)
        async with Client(app, headers=TENANT) as client:
            pay = client.request("/payments", CALLS[0][2])
            answers = await client.copies(pay, 12)
            first = assert_executed_once(answers)
            others = {a.outcome for a in answers if a is not first}
            # Without a wait the copies that found the first running are told 409; with one,
            # they wait for its answer and replay it.
            assert others <= ({"in_flight", "replayed"} if wait == 0 else {"replayed"}), answers
            await assert_count(store, 1, PAYMENTS, pay.key)


@pytest.mark.parametrize("wait", [0.0, 5.0])
async def test_a_dropped_connection_is_answered_from_the_ledger(
    kit_stores: TestStores, wait: float
) -> None:
    clock = FakeClock()
    async with (
        await kit_stores.fresh(clock) as store,
        Client(shop(wait=wait, slow=0.3)(store, clock), headers=TENANT) as client,
    ):
        pay = client.request("/payments", CALLS[0][2])
        dropped, retry = await client.drop(pay)
        # The server ran the first to its end (nobody heard the answer); the retry came while
        # it ran: 409 in progress with Retry-After, or, with a wait, the first's stored answer.
        assert dropped.dropped, dropped
        assert dropped.outcome == "executed", dropped
        if wait == 0:
            assert retry.outcome == "in_flight", retry
            assert retry.header("retry-after") is not None, retry
        else:
            assert_replayed(dropped, [retry])
        assert_replayed(dropped, [await client.send(pay)])
        check_answers(str(pay.key), [dropped, retry])
        await assert_count(store, 1, PAYMENTS, pay.key)


async def test_a_reserialized_body_is_the_same_request(kit_stores: TestStores) -> None:
    clock = FakeClock()
    async with (
        await kit_stores.fresh(clock) as store,
        Client(shop()(store, clock), headers=TENANT) as client,
    ):
        pay = client.request("/payments", CALLS[0][2])
        first = await client.send(pay)
        others = [reserialize(pay, style) for style in STYLES]
        assert len({pay.body, *(o.body for o in others)}) == 1 + len(STYLES)
        # The middleware compares JSON normalized: key order, whitespace and escapes are
        # not the request.
        assert_replayed(first, [await client.send(o) for o in others])
        # Numbers by their value: 1200.0 (a client that writes every number as a float) is
        # the same request; 1200.5 is another, refused with 422 and nothing run.
        floats = client.request("/payments", {**CALLS[0][2], "amount": 1200.0}, key=pay.key)
        assert_replayed(first, [await client.send(floats)])
        other = client.request("/payments", {**CALLS[0][2], "amount": 1200.5}, key=pay.key)
        refused = await client.send(other)
        assert (refused.outcome, refused.status) == ("mismatch", 422), refused
        await assert_count(store, 1, PAYMENTS, pay.key)


async def test_a_crash_before_the_answer_is_stored_is_recovered(kit_stores: TestStores) -> None:
    clock = FakeClock()
    # A middleware that makes retries wait 5 s for a running first request: the kit does not
    # wait for a dead one on real time (its answer can only be 409 on the fake clock).
    async with (
        await kit_stores.fresh(clock) as store,
        Client(shop(wait=5.0)(store, clock), headers=TENANT) as client,
    ):
        pay = client.request("/payments", CALLS[0][2])
        died = await client.send(pay, fault=Fault.BEFORE_COMMIT)
        assert died.outcome == "died"
        began = time.monotonic()
        held = await client.send(pay)
        assert time.monotonic() - began < 2.5
        assert (held.outcome, held.header("retry-after") is not None) == ("in_flight", True)
        await assert_count(store, 0, PAYMENTS, pay.key)  # rolled back with the crash
        clock.advance(LEASE + 1)
        assert (await client.middleware.sweep()).released == 1  # the key given back
        recovered = await client.send(pay)
        assert recovered.outcome == "executed", recovered
        await assert_count(store, 1, PAYMENTS, pay.key)


async def test_an_app_without_the_middleware_is_named() -> None:
    app = Starlette(routes=[Route("/payments", lambda r: Response(b""), methods=["POST"])])
    with pytest.raises(ConfigurationError, match="no IdempotencyKeyMiddleware"):
        async with Client(app):
            pass


def test_a_correct_endpoint_passes(kit_stores: TestStores) -> None:
    check_requests(
        shop(),
        CALLS,
        headers=TENANT,
        invariant=at_most_one_payment_per_key,
        final=one_payment_per_request,
        stores=kit_stores,
        max_examples=12 if kit_stores.kind == "sqlite" else 8,
    )


def test_an_endpoint_writing_outside_tx_is_caught_and_shrunk(kit_stores: TestStores) -> None:
    with pytest.raises(AssertionError) as caught:
        check_requests(
            shop(broken=True),
            CALLS,
            headers=TENANT,
            invariant=at_most_one_payment_per_key,
            final=one_payment_per_request,
            stores=kit_stores,
            max_examples=60,
        )
    message = str(caught.value)
    assert "charged twice: 1 key(s)" in message, message
    shown = re.search(r"steps: (\[.*\])", message)
    assert shown is not None, message
    # Shrunk to the one step that shows it: the endpoint failed after its write (500, the key
    # given back), and the retry of the recovery ran it again.
    assert shown.group(1) == "[send(r0, handler_error)]", message


async def test_an_async_test_is_told_to_be_a_plain_one(kit_stores: TestStores) -> None:
    with pytest.raises(ConfigurationError, match="plain `def` test"):
        check_requests(shop(), CALLS, stores=kit_stores)


def test_anything_but_json_is_not_reserialized() -> None:
    from receiver.testing import KeyedRequest

    with pytest.raises(ConfigurationError, match="only a JSON body"):
        reserialize(KeyedRequest("POST", "/notes", b"plain text", "k-1"))
    with pytest.raises(ConfigurationError, match="unknown style"):
        reserialize(KeyedRequest("POST", "/notes", b"{}", "k-1"), "yaml")
