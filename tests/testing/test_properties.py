"""The kit catches bugs: random redelivery orders against a user's handler and invariant.

A handler that writes through ``tx`` passes; one that writes the same row on a connection of
its own (outside ``tx``) fails, and hypothesis shrinks the order to the one step that shows it.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from receiver import Connection, Event, PostgresStore, Provider, Receiver, SQLiteStore, Store
from receiver.testing import FakeClock, TestStores, check_redeliveries, count

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
EVENTS = [("order.paid", {"order": "o-1"}), ("order.paid", {"order": "o-2"})]
TABLE = "CREATE TABLE IF NOT EXISTS shipments (order_id TEXT NOT NULL)"


async def at_most_one_shipment_per_order(conn: Connection) -> None:
    rows = await conn.fetch(
        "SELECT order_id, count(*) AS n FROM shipments GROUP BY order_id HAVING count(*) > 1"
    )
    assert not rows, f"shipped twice: {[dict(r) for r in rows]}"


async def one_shipment_per_order(conn: Connection) -> None:
    await at_most_one_shipment_per_order(conn)
    assert await count(conn, "SELECT count(DISTINCT order_id) FROM shipments") == len(EVENTS)


async def outside(store: Store, order_id: str) -> None:
    """The bug: the row goes in on a connection of the handler's own, so it commits at once,
    whatever becomes of the delivery."""
    if isinstance(store, SQLiteStore):
        db = sqlite3.connect(store.path, timeout=10)
        try:
            db.execute("INSERT INTO shipments (order_id) VALUES (?)", (order_id,))
            db.commit()
        finally:
            db.close()
        return
    assert isinstance(store, PostgresStore)
    conn = await asyncpg.connect(store._dsn)
    try:
        await conn.execute("INSERT INTO shipments (order_id) VALUES ($1)", order_id)
    finally:
        await conn.close()


def shop(*, broken: bool) -> Callable[[Store, FakeClock], Receiver]:
    def build(store: Store, clock: FakeClock) -> Receiver:
        rx = Receiver(store, [Provider("shop", [SECRET])], clock=clock, sweep_interval=None)

        @rx.on_startup
        async def tables(conn: Connection) -> None:
            await conn.execute(TABLE)

        @rx.on("order.paid")
        async def ship(event: Event, tx: Connection) -> Any:
            order_id = event.payload["data"]["order"]
            if broken:
                await outside(store, order_id)
            else:
                await tx.execute("INSERT INTO shipments (order_id) VALUES ($1)", order_id)
            return {"shipped": order_id}

        return rx

    return build


def test_a_correct_handler_passes(kit_stores: TestStores) -> None:
    check_redeliveries(
        shop(broken=False),
        "shop",
        SECRET,
        EVENTS,
        invariant=at_most_one_shipment_per_order,
        final=one_shipment_per_order,
        stores=kit_stores,
        max_examples=15 if kit_stores.kind == "sqlite" else 10,
    )


def test_a_write_outside_tx_is_caught_and_shrunk(kit_stores: TestStores) -> None:
    with pytest.raises(AssertionError) as caught:
        check_redeliveries(
            shop(broken=True),
            "shop",
            SECRET,
            EVENTS,
            invariant=at_most_one_shipment_per_order,
            final=one_shipment_per_order,
            stores=kit_stores,
            max_examples=60,
        )
    message = str(caught.value)
    assert "shipped twice" in message
    # Shrunk to the one step that shows it: the handler failed after its write, the retry
    # of the recovery ran it again.
    shown = re.search(r"steps: (\[.*\])", message)
    assert shown is not None, message
    # One step, as a rule; hypothesis may stop shrinking early on a loaded machine (its shrink
    # phase has a time budget), so a step or two more is tolerated, the failing one never.
    steps = re.findall(r"deliver\([^)]*\)|\w+\([^)]*\)", shown.group(1))
    assert any(re.fullmatch(r"deliver\(e\d+, handler_error\)", step) for step in steps), message
    assert len(steps) <= 3, message


async def test_an_async_test_is_told_to_be_a_plain_one(kit_stores: TestStores) -> None:
    from receiver import ConfigurationError

    with pytest.raises(ConfigurationError, match="plain `def` test"):
        check_redeliveries(shop(broken=False), "shop", SECRET, EVENTS, stores=kit_stores)
