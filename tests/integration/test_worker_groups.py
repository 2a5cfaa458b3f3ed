"""A PostgreSQL worker runs queued deliveries whose handlers are all transactional several to a
transaction (Pipeline.process_together): one BEGIN, one pipelined completion statement and one
COMMIT per group. What must hold: each delivery's writes commit exactly once with its
completion; a member that fails, or whose fence went stale, costs the others nothing but a
second run of their (rolled back) handlers; external handlers never share a transaction."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
import pytest

from receiver import ConfigurationError, Event, PostgresStore, Provider, Receiver, State
from receiver._store.base import Connection
from tests.integration.test_queued import drain, receipt
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, Clock, signed

pytestmark = pytest.mark.asyncio


def _receiver(store: PostgresStore, clock: Clock, state: dict[str, Any]) -> Receiver:
    store.clock = clock
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued", lease=30.0)], clock=clock)

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> None:
        state["calls"][event.id] = state["calls"].get(event.id, 0) + 1
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        try:
            await _act(event, tx)
        finally:
            state["now"] -= 1

    async def _act(event: Event, tx: Connection) -> None:
        await asyncio.sleep(state["slow"])
        if event.id in state["waits"]:
            # Waits for another delivery's handler (of the same fetch) to have run.
            await asyncio.wait_for(state["waits"][event.id].wait(), 10)
        if event.id in state["signals"]:
            state["signals"][event.id].set()
        # The transaction this delivery's writes commit in.
        try:
            xid = await tx.fetchval("SELECT txid_current()::text")
        except Exception as exc:
            # A handler that wraps the driver's errors in its own, explicitly or not.
            if state["wrap"].get(event.id) == "from":
                raise LookupError("the order's transaction is unusable") from exc
            if state["wrap"].get(event.id) == "context":
                raise LookupError("the order's transaction is unusable")  # noqa: B904
            raise
        state["xids"][event.id] = xid
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            xid,
        )
        if event.id in state["fail"]:
            state["fail"].discard(event.id)
            raise RuntimeError("downstream refused")
        if event.id in state["swallow"]:
            # A handler that hides a database error: its transaction is aborted, which only
            # the next statement in it finds out.
            with contextlib.suppress(Exception):
                await tx.execute("SELECT 1 / 0")
        steal = state["steal"].pop(event.id, None)
        if steal is not None:
            # Another attempt takes a later member over meanwhile (as the stale recovery of
            # another worker would): its fence moves on, outside this transaction.
            async with store.acquire_aside() as other:
                await other.execute(
                    "UPDATE receiver_receipts SET fence = fence + 1 "
                    "WHERE provider = $1 AND webhook_id = $2",
                    PROVIDER,
                    steal,
                )

    @rx.on("payment.*", effects="external")
    async def charge(event: Event, tx: Connection) -> None:
        state["calls"][event.id] = state["calls"].get(event.id, 0) + 1

    return rx


async def _queue(rx: Receiver, clock: Clock, ids: list[str], kind: str = "order.created") -> None:
    for webhook_id in ids:
        body = orjson.dumps({"type": kind, "data": {"id": webhook_id}})
        reply = await rx.deliver(PROVIDER, signed(webhook_id, body, timestamp=clock()), body)
        assert reply.status_code == 202


async def _effects(store: PostgresStore) -> dict[str, list[str]]:
    async with store.acquire() as conn:
        rows = await conn.fetch("SELECT webhook_id, note FROM effects ORDER BY webhook_id")
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["webhook_id"], []).append(row["note"])
    return found


def _state() -> dict[str, Any]:
    return {
        "calls": {},
        "xids": {},
        "fail": set(),
        "steal": {},
        "swallow": set(),
        "wrap": {},
        "slow": 0.0,
        "now": 0,
        "most": 0,
        "waits": {},
        "signals": {},
    }


async def test_deliveries_share_transactions_and_each_commits_once(pg_store: PostgresStore) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(24)]
        await _queue(rx, clock, ids)
        done = await drain(rx, concurrency=24, group=8)
        assert done == {"executed": 24}
        effects = await _effects(pg_store)
        assert sorted(effects) == ids
        assert all(len(rows) == 1 for rows in effects.values())
        # Fewer transactions than deliveries, none with more than a group's members; each
        # row committed in the transaction its handler saw.
        xids = [rows[0] for rows in effects.values()]
        assert len(set(xids)) < len(ids)
        assert max(xids.count(x) for x in set(xids)) <= 8
        assert all(effects[i] == [state["xids"][i]] for i in ids)
        for webhook_id in ids:
            assert (await receipt(pg_store, webhook_id)).state is State.COMPLETED


async def test_group_one_gives_each_delivery_its_own_transaction(pg_store: PostgresStore) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(12)]
        await _queue(rx, clock, ids)
        assert await drain(rx, concurrency=12, group=1) == {"executed": 12}
        effects = await _effects(pg_store)
        assert len({rows[0] for rows in effects.values()}) == 12


async def test_a_failing_member_rolls_back_alone_and_the_rest_commit_once(
    pg_store: PostgresStore,
) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(8)]
        state["fail"].add("msg_03")  # its first attempt fails; the retry succeeds
        await _queue(rx, clock, ids)
        done = await drain(rx, concurrency=8, group=8)
        assert done.get("handler_failed") == 1
        clock.advance(120)  # past the first retry's delay
        done = await drain(rx, concurrency=8, group=8)
        assert done == {"executed": 1}
        effects = await _effects(pg_store)
        assert sorted(effects) == ids
        assert all(len(rows) == 1 for rows in effects.values()), effects
        failed = await receipt(pg_store, "msg_03")
        assert failed.state is State.COMPLETED
        assert failed.attempts == 1
        # The failed attempt is the failing member's alone, counted once; the members before
        # it ran again (their first run rolled back with the group), the ones after it once.
        assert state["calls"] == {
            **{f"msg_0{i}": 2 for i in range(3)},
            "msg_03": 2,  # the failed attempt and its retry
            **{f"msg_0{i}": 1 for i in range(4, 8)},
        }


async def test_a_member_taken_over_meanwhile_is_lease_lost_and_writes_nothing(
    pg_store: PostgresStore,
) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(6)]
        state["steal"]["msg_00"] = "msg_04"
        await _queue(rx, clock, ids)
        done = await drain(rx, concurrency=6, group=6)
        assert done == {"executed": 5, "lease_lost": 1}
        effects = await _effects(pg_store)
        # The stolen member's writes rolled back with the group: the newer attempt (here:
        # nobody) owns it now. Every other member committed once, on its own.
        assert sorted(effects) == [i for i in ids if i != "msg_04"]
        assert all(len(rows) == 1 for rows in effects.values())
        stolen = await receipt(pg_store, "msg_04")
        assert stolen.state is State.IN_FLIGHT
        assert stolen.fence == 2  # the fetch's was 1


@pytest.mark.parametrize("where", ["msg_02", "msg_05"])  # mid-group, and the last member
async def test_a_swallowed_database_error_is_blamed_on_its_handler_alone(
    pg_store: PostgresStore, where: str
) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(6)]
        state["swallow"].add(where)
        await _queue(rx, clock, ids)
        done = await drain(rx, concurrency=6, group=6)
        # The next statement of the group failed on the aborted transaction: not that
        # member's failure, so each ran again on its own, where the one that hid the error
        # fails its own completion.
        assert done == {"executed": 5, "handler_failed": 1}
        effects = await _effects(pg_store)
        assert sorted(effects) == [i for i in ids if i != where]
        assert all(len(rows) == 1 for rows in effects.values())
        assert (await receipt(pg_store, where)).attempts == 1


@pytest.mark.parametrize("how", ["from", "context"])
async def test_a_member_that_wraps_the_aborted_statement_is_not_charged(
    pg_store: PostgresStore, how: str
) -> None:
    """The member after the one that hid a database error raises its own error, with the
    driver's as its cause (``raise ... from exc``) or context: the whole chain is read, so the
    group runs alone instead of charging that member with a failure it did not cause."""
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(6)]
        state["swallow"].add("msg_02")
        state["wrap"]["msg_03"] = how
        await _queue(rx, clock, ids)
        done = await drain(rx, concurrency=6, group=6)
        assert done == {"executed": 5, "handler_failed": 1}
        effects = await _effects(pg_store)
        assert sorted(effects) == [i for i in ids if i != "msg_02"]
        assert (await receipt(pg_store, "msg_03")).attempts == 0
        assert (await receipt(pg_store, "msg_03")).state is State.COMPLETED
        assert (await receipt(pg_store, "msg_02")).attempts == 1


async def test_slow_handlers_still_run_side_by_side(pg_store: PostgresStore) -> None:
    clock, state = Clock(), _state()
    state["slow"] = 0.2  # four times a group's budget: the rest start on their own
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(8)]
        await _queue(rx, clock, ids)
        assert await drain(rx, concurrency=8, group=8) == {"executed": 8}
        assert state["most"] >= 7  # the first in its group, the other seven side by side
        effects = await _effects(pg_store)
        assert sorted(effects) == ids
        assert all(len(rows) == 1 for rows in effects.values())


async def test_a_handler_waiting_for_a_later_member_is_not_stuck_behind_it(
    pg_store: PostgresStore,
) -> None:
    clock, state = Clock(), _state()
    gate = asyncio.Event()
    state["waits"]["msg_00"] = gate  # the group's first member waits for its last one
    state["signals"]["msg_05"] = gate
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(6)]
        await _queue(rx, clock, ids)
        assert await drain(rx, concurrency=6, group=6) == {"executed": 6}
        effects = await _effects(pg_store)
        assert sorted(effects) == ids
        assert all(len(rows) == 1 for rows in effects.values())


async def test_external_handlers_never_share_a_transaction(pg_store: PostgresStore) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        await _queue(rx, clock, [f"pay_{i}" for i in range(4)], kind="payment.created")
        await _queue(rx, clock, [f"msg_{i}" for i in range(4)])
        state["fail"].add("msg_0")  # the group of the transactional ones rolls back once
        done = await drain(rx, concurrency=8, group=8)
        assert done == {"executed": 7, "handler_failed": 1}
        # The external ones ran once each, whatever their neighbours did.
        assert all(state["calls"][f"pay_{i}"] == 1 for i in range(4))


async def test_group_must_be_positive(pg_store: PostgresStore) -> None:
    rx = _receiver(pg_store, Clock(), _state())
    with pytest.raises(ConfigurationError, match="group must be a whole number from 1"):
        rx.worker(group=0)
