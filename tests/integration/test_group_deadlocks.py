"""A group transaction holds every member's row locks until its one COMMIT, so two groups
whose members touch the same rows in opposite orders deadlock where each delivery alone (one
row, one transaction) never would. PostgreSQL then aborts one group: its members are not
charged a failed attempt (the deadlock is the grouping's, not a handler's), they run again
on their own, and each delivery's writes commit once. For a worker's groups of queued
receipts and for inline deliveries' groups alike."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from receiver import Event, PostgresStore, Provider, Receiver, State
from receiver._store.base import Connection
from receiver._webhooks import groups
from tests.integration.test_queued import drain, receipt
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, Clock, signed

pytestmark = pytest.mark.asyncio

SKUS = ("x", "y")


def _receiver(
    store: PostgresStore, clock: Clock, seen: dict[str, Any], mode: str = "queued"
) -> Receiver:
    """A stock handler that takes one unit of one SKU. The first member of each of the two
    groups takes a different SKU and waits (a barrier) until both hold theirs; every later
    member of a group takes the SKU its group's first member did not: the two groups then
    wait for each other's row."""
    store.clock = clock
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode=mode, lease=30.0)], clock=clock)
    both_hold = asyncio.Barrier(2)
    seen.update(calls={}, held={}, release=asyncio.Event())

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)
        await conn.execute("CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, n INTEGER)")
        await conn.execute("DELETE FROM stock")
        await conn.execute("INSERT INTO stock (sku, n) VALUES ('x', 0), ('y', 0)")

    @rx.on("stock.*")
    async def take(event: Event, tx: Connection) -> None:
        seen["calls"][event.id] = seen["calls"].get(event.id, 0) + 1
        xid = await tx.fetchval("SELECT txid_current()::text")
        first = xid not in seen["held"] and len(seen["held"]) < len(SKUS)
        if first:
            sku = SKUS[len(seen["held"])]
            seen["held"][xid] = sku
        elif xid in seen["held"]:
            sku = next(s for s in SKUS if s != seen["held"][xid])
        else:
            sku = SKUS[0]  # on its own: one row, nothing else held
        await tx.execute("UPDATE stock SET n = n + 1 WHERE sku = $1", sku)
        if first:
            await asyncio.wait_for(both_hold.wait(), 10)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            sku,
        )

    @rx.on("order.held")
    async def held(event: Event, tx: Connection) -> None:
        await asyncio.wait_for(seen["release"].wait(), 10)

    return rx


def _body(webhook_id: str, event_type: str = "stock.taken") -> bytes:
    return orjson.dumps({"type": event_type, "data": {"id": webhook_id}})


async def _deliver(
    rx: Receiver, clock: Clock, webhook_id: str, event_type: str = "stock.taken"
) -> int:
    body = _body(webhook_id, event_type)
    reply = await rx.deliver(PROVIDER, signed(webhook_id, body, timestamp=clock()), body)
    return reply.status_code


async def _outcome(store: PostgresStore, ids: list[str]) -> tuple[list[Any], list[str], int]:
    """Each receipt's (state, attempts, last error), the effects' ids and the units taken."""
    async with store.acquire() as conn:
        effects = await conn.fetch("SELECT webhook_id FROM effects")
        stock = await conn.fetchval("SELECT sum(n) FROM stock")
    found = [await receipt(store, i) for i in ids]
    return (
        [(r.state, r.attempts, r.last_error) for r in found],
        sorted(r["webhook_id"] for r in effects),
        int(stock),
    )


async def test_a_deadlock_between_two_groups_charges_no_member(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each group takes both its members even while its first waits at the barrier.
    monkeypatch.setattr(groups, "GROUP_BUDGET", 10.0)
    clock, seen = Clock(), {}
    rx = _receiver(pg_store, clock, seen)
    ids = [f"msg_{i}" for i in range(4)]
    async with rx:
        for webhook_id in ids:
            assert await _deliver(rx, clock, webhook_id) == 202
        done = await drain(rx, concurrency=4, group=2)  # two groups of two, side by side
        receipts, effects, stock = await _outcome(pg_store, ids)
    assert len(seen["held"]) == 2  # both groups held a row: the deadlock happened
    assert max(seen["calls"].values()) == 2  # the aborted group's members ran again
    assert done == {"executed": 4}
    assert receipts == [(State.COMPLETED, 0, None)] * 4
    assert effects == ids
    assert stock == 4


async def test_a_deadlock_between_two_inline_groups_answers_no_sender_500(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two members make a group beside one under way; a group takes both its members even
    # while its first waits at the barrier.
    monkeypatch.setattr(groups, "GROUP_MIN", 2)
    monkeypatch.setattr(groups, "GROUP_BUDGET", 10.0)
    clock, seen = Clock(), {}
    rx = _receiver(pg_store, clock, seen, mode="inline")
    ids = [f"msg_{i}" for i in range(4)]
    async with rx:
        # A delivery under way, so that the next ones wait for groups instead of running alone.
        held = asyncio.ensure_future(_deliver(rx, clock, "held", "order.held"))
        for _ in range(200):
            if rx.pipeline.groups._in_flight:
                break
            await asyncio.sleep(0.01)
        first = [asyncio.ensure_future(_deliver(rx, clock, i)) for i in ids[:2]]
        for _ in range(200):  # the first group began: its first member holds its row
            if seen["held"]:
                break
            await asyncio.sleep(0.01)
        assert len(seen["held"]) == 1
        second = [asyncio.ensure_future(_deliver(rx, clock, i)) for i in ids[2:]]
        answers = await asyncio.gather(*first, *second)
        seen["release"].set()
        assert await held == 200
        receipts, effects, stock = await _outcome(pg_store, ids)
    assert len(seen["held"]) == 2
    assert max(seen["calls"].values()) == 2
    assert answers == [200] * 4
    assert receipts == [(State.COMPLETED, 0, None)] * 4
    assert effects == ids
    assert stock == 4
