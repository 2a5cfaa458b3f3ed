"""The kit tells users the truth about their stores (issue 19, items 7 and 8), on both stores:
a queued delivery a worker took and died on is "in flight", and every fresh store starts its
serial ids at 1, as a new SQLite file does."""

from __future__ import annotations

import pytest

from receiver._ledger.receipts import Claim, Key
from receiver._queue import receipts as queue
from receiver.testing import FakeClock, TestStores, assert_nothing_in_flight, in_flight


async def test_a_queued_delivery_a_dead_worker_held_is_in_flight(kit_stores: TestStores) -> None:
    clock = FakeClock()
    store = await kit_stores.fresh(clock)
    async with store:
        claim = Claim(Key("acme", "msg_q"), b"h" * 32, "order.created", b"{}", clock(), 60, 3600)
        async with store.acquire() as conn:
            await queue.enqueue(conn, [claim], clock())
            (taken,) = await queue.fetch(conn, clock(), 10, 30.0)  # a worker takes it ...
        assert taken["webhook_id"] == "msg_q"
        clock.advance(3 * 86_400)  # ... and dies: its lease ran out long ago
        assert await in_flight(store) == ["acme/msg_q (fence 1)"]
        with pytest.raises(AssertionError, match="left in flight"):
            await assert_nothing_in_flight(store)


async def test_every_fresh_store_starts_its_serial_ids_at_one(kit_stores: TestStores) -> None:
    seen = []
    for _ in range(2):
        store = await kit_stores.fresh()
        async with store, store.acquire() as conn:
            if kit_stores.kind == "postgresql":
                ddl = "CREATE TABLE IF NOT EXISTS kit_serials (id SERIAL PRIMARY KEY, v TEXT)"
            else:
                ddl = "CREATE TABLE IF NOT EXISTS kit_serials (id INTEGER PRIMARY KEY, v TEXT)"
            await conn.execute(ddl)
            await conn.execute("INSERT INTO kit_serials (v) VALUES ($1)", "x")
            seen.append(await conn.fetchval("SELECT max(id) FROM kit_serials"))
    assert seen == [1, 1]
