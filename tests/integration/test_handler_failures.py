"""A handler's own exception is a handler failure, whatever its type (issue 14, item 1).

Before the fix, on PostgreSQL, an exception raised after the handler's first ``tx`` statement
ran inside the driver-error translation of the transaction: a ``TimeoutError``, ``OSError`` or
``asyncpg.InterfaceError`` from a downstream call or a handler bug became ``StoreUnavailable``,
the sender got 503 instead of 500, and the claim stayed in flight. Here every such type, on both
stores, must answer 500, roll back the handler's write, release the claim and keep the error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from receiver import Connection, Event, PostgresStore, Provider, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key, State
from tests.conftest import truncate
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    SECRET,
    Clock,
    body_of,
    effects,
    ledger_clock,
    signed,
    write_effect,
)

# Errors a handler meets in real life, several of which the driver translation used to take
# for "the database is gone".
ERRORS: dict[str, BaseException] = {
    "timeout": TimeoutError("the payment API timed out"),
    "refused": ConnectionRefusedError(111, "Connection refused"),
    "oserror": OSError("network is unreachable"),
    "interface": asyncpg.InterfaceError(
        "cannot perform operation: another operation is in progress"
    ),
    "connection_gone": asyncpg.exceptions.ConnectionDoesNotExistError("downstream pool closed"),
    "postgres_08": asyncpg.exceptions.ConnectionFailureError("a downstream database went away"),
    "value": ValueError("bad amount"),
    "runtime": RuntimeError("bug"),
}


def receiver_on(store: Store, clock: Clock, lease: float = 60.0) -> Receiver:
    rx = Receiver(
        ledger_clock(store, clock), [Provider(PROVIDER, [SECRET], lease=lease)], clock=clock
    )

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    return rx


def build(store: Store, clock: Clock, raise_: BaseException | None) -> Receiver:
    rx = receiver_on(store, clock)

    @rx.on("order.created")
    async def handler(event: Event, tx: Connection) -> dict[str, str]:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if raise_ is not None:
            raise raise_
        return {"ok": "yes"}

    return rx


async def deliver(rx: Receiver, clock: Clock, webhook_id: str = "msg_1") -> httpx.Response:
    body = body_of(order="o-1")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=rx), base_url="http://test"
    ) as client:
        return await client.post(
            f"/{PROVIDER}", content=body, headers=signed(webhook_id, body, timestamp=clock.now)
        )


async def receipt(store: Store, webhook_id: str = "msg_1") -> ledger.Receipt:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    return found


@pytest.mark.parametrize("kind", sorted(ERRORS))
async def test_any_handler_exception_is_500_and_released(store: Store, kind: str) -> None:
    clock = Clock()
    rx = build(store, clock, ERRORS[kind])
    await rx.open()
    try:
        response = await deliver(rx, clock)
        assert response.status_code == 500, response.text
        assert response.json()["error"] == "handler_failed"
        assert "retry-after" not in response.headers
        assert await effects(store) == 0  # the handler's write rolled back
        found = await receipt(store)
        assert found.state is State.RELEASED
        assert found.attempts == 1
        assert found.last_error is not None
        assert found.last_error.startswith(type(ERRORS[kind]).__name__)
        assert rx.metrics is not None
        assert rx.metrics.registry.get_sample_value(
            "receiver_deliveries_total",
            {"provider": PROVIDER, "outcome": "store_unavailable"},
        ) in (None, 0.0)
        # The sender's retry runs it again, under the next fence.
        retried = build(store, clock, None)
        await retried.open()
        try:
            again = await deliver(retried, clock)
        finally:
            await retried.close()
        assert again.status_code == 200
        assert (await receipt(store)).fence == 2
        assert await effects(store) == 1
    finally:
        await rx.close()


async def test_a_statement_cancelled_mid_flight_is_a_handler_failure(store: Store) -> None:
    """A handler that bounds its own query with a timeout: the statement is cancelled inside
    the transaction. That is the handler's failure: 500 and released, never 503."""
    clock = Clock()
    rx = receiver_on(store, clock)
    slow = "SELECT pg_sleep(5)" if store.dialect == "postgresql" else None

    @rx.on("order.created")
    async def handler(event: Event, tx: Connection) -> Any:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if slow is not None:
            await asyncio.wait_for(tx.execute(slow), 0.05)
        else:
            # SQLite statements cannot be interrupted this way; the handler's own awaitable is.
            await asyncio.wait_for(asyncio.sleep(5), 0.05)
        return None

    await rx.open()
    try:
        response = await deliver(rx, clock)
        assert response.status_code == 500, response.text
        assert await effects(store) == 0
        found = await receipt(store)
        assert found.state is State.RELEASED
        assert found.last_error is not None
        assert found.last_error.startswith("TimeoutError")
    finally:
        await rx.close()


async def test_a_handler_error_before_any_statement_is_500_too(store: Store) -> None:
    clock = Clock()
    rx = receiver_on(store, clock)

    @rx.on("order.created")
    async def handler(event: Event, tx: Connection) -> None:
        raise ConnectionRefusedError(111, "the CRM refused the connection")

    await rx.open()
    try:
        response = await deliver(rx, clock)
        assert response.status_code == 500
        assert (await receipt(store)).state is State.RELEASED
    finally:
        await rx.close()


async def test_external_handler_failing_with_oserror_is_released_not_reviewed(
    store: Store,
) -> None:
    """Before the fix, the claim stayed in flight and the next sweep marked the external
    handler's receipt needs-review although the outside call never happened."""
    clock = Clock()
    rx = receiver_on(store, clock, lease=30)

    @rx.on("order.created", effects="external")
    async def handler(event: Event, tx: Connection) -> None:
        await tx.execute("SELECT 1")
        raise OSError("the partner API is unreachable")

    await rx.open()
    try:
        assert (await deliver(rx, clock)).status_code == 500
        clock.advance(31)
        report = await rx.sweep()
        assert report.failed == 0
        assert (await receipt(store)).state is State.RELEASED
    finally:
        await rx.close()


async def test_no_connection_for_the_handler_s_first_statement_is_kept_as_such(
    pg_url: str,
) -> None:
    """The handler's first statement borrows a connection and begins the transaction; when no
    connection can be had, that failure is the one kept and reported (it used to be replaced
    by an AssertionError from ending a transaction that never began)."""
    clock = Clock()
    async with PostgresStore(pg_url, max_size=1, acquire_timeout=0.2) as store:
        await truncate(pg_url)
        rx = receiver_on(store, clock)

        @rx.on("order.created")
        async def handler(event: Event, tx: Connection) -> None:
            async with store.acquire():  # the pool's only connection, held
                await write_effect(tx, event.provider, event.id, event.fence)

        await rx.open()
        try:
            response = await deliver(rx, clock, "msg_no_connection")
            assert response.status_code == 500, response.text
            found = await receipt(store, "msg_no_connection")
            assert found.state is State.RELEASED
            assert found.last_error is not None
            assert found.last_error.startswith("StoreUnavailable"), found.last_error
        finally:
            await rx.close()
