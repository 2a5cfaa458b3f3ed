"""The kit drives a user's own tools through their executor, on both stores: concurrent twins
through one barrier, a crash after the external call recovered by the retry, the sweeper or
reconcile, a restarted planner, a regeneration; and random histories of all of these checked
against the user's invariant ("one refund row per order"), where a tool that writes outside
``tx`` fails, shrunk to the one step that shows it."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from receiver import (
    RUN_AGAIN,
    Actions,
    Connection,
    PostgresStore,
    SQLiteStore,
    Store,
    ToolCall,
)
from receiver.testing import (
    FakeClock,
    Fault,
    Planner,
    TestStores,
    assert_count,
    assert_executed_once,
    assert_replayed,
    check_actions,
    check_attempts,
    count,
    crash_and_recover,
)

LEASE = 30.0
DDL = (
    "CREATE TABLE IF NOT EXISTS kit_refunds (order_id TEXT NOT NULL, reason TEXT)",
    "CREATE TABLE IF NOT EXISTS kit_outbox ("
    " downstream_key TEXT PRIMARY KEY, recipient TEXT NOT NULL)",
)
PROPOSALS: list[tuple[str, str, dict[str, Any]]] = [
    ("refund_order", "order-1", {"order_id": "o-1", "cents": 1200, "reason": "broken on arrival"}),
    ("send_email", "order-1-mail", {"to": "ada@example.com", "body": "Your refund is on its way"}),
]
REFUNDS = "SELECT count(*) FROM kit_refunds WHERE order_id = $1"


def _sqlite_write(path: str, sql: str, args: tuple[Any, ...]) -> None:
    db = sqlite3.connect(path, timeout=10)
    try:
        db.execute(sql, args)
        db.commit()
    finally:
        db.close()


async def outside(store: Store, sql: str, *args: Any) -> None:
    """A write on a connection of the tool's own: it commits at once, whatever becomes of the
    attempt (the outside world, or a bug)."""
    if isinstance(store, SQLiteStore):
        # In a thread: the store's connection may hold the write lock for a group commit that
        # only the event loop can finish.
        await asyncio.to_thread(_sqlite_write, store.path, re.sub(r"\$\d", "?", sql), args)
        return
    assert isinstance(store, PostgresStore)
    conn = await asyncpg.connect(store._dsn)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


def shop(
    *, broken: bool = False, reconciles: bool = True, volatile: tuple[str, ...] = ("reason",)
) -> Callable[[Store, FakeClock], Any]:
    """The user's executor factory: a transactional refund (written through ``tx``, or, when
    ``broken``, on a connection of its own; the model's ``reason`` is ``volatile``) and an
    external email whose provider dedups on the downstream key, with a reconcile that asks
    it."""

    async def build(store: Store, clock: FakeClock) -> Actions:
        async with store.acquire() as conn:
            for statement in DDL:
                await conn.execute(statement)
        actions = Actions(store, lease=LEASE, wait=5.0, sweep_interval=None, metrics=False)

        @actions.tool("refund_order", volatile=volatile)
        async def refund_order(call: ToolCall, tx: Connection) -> Any:
            insert = "INSERT INTO kit_refunds (order_id, reason) VALUES ($1, $2)"
            if broken:
                await outside(store, insert, call.request["order_id"], call.request["reason"])
            else:
                await tx.execute(insert, call.request["order_id"], call.request["reason"])
            return {"refunded": call.request["cents"], "order": call.request["order_id"]}

        async def find_email(call: ToolCall) -> Any:
            async with store.acquire() as conn:
                sent = await conn.fetchval(
                    "SELECT recipient FROM kit_outbox WHERE downstream_key = $1",
                    call.downstream_key,
                )
            return RUN_AGAIN if sent is None else {"sent_to": sent}

        @actions.tool(
            "send_email",
            effects="external",
            reconcile=find_email if reconciles else None,
            volatile=("body",),
        )
        async def send_email(call: ToolCall, tx: Connection) -> Any:
            await outside(
                store,
                "INSERT INTO kit_outbox (downstream_key, recipient) VALUES ($1, $2)"
                " ON CONFLICT (downstream_key) DO NOTHING",
                call.downstream_key,
                call.request["to"],
            )
            return {"sent_to": call.request["to"]}

        return actions

    return build


async def at_most_one_refund_per_order(conn: Connection) -> None:
    rows = await conn.fetch(
        "SELECT order_id, count(*) AS n FROM kit_refunds GROUP BY order_id HAVING count(*) > 1"
    )
    assert not rows, f"refunded twice: {[r['order_id'] for r in rows]}"


async def one_refund_and_one_email(conn: Connection) -> None:
    await at_most_one_refund_per_order(conn)
    assert await count(conn, "SELECT count(*) FROM kit_refunds") == 1, "no refund"
    assert await count(conn, "SELECT count(*) FROM kit_outbox") == 1, "no email"


async def test_twins_of_one_action_run_it_once(kit_stores: TestStores) -> None:
    clock = FakeClock()
    async with await kit_stores.fresh(clock) as store:
        planner = Planner(await shop()(store, clock))
        action = planner.propose(*PROPOSALS[0])
        attempts = await planner.twins(action, 12)
        first = assert_executed_once(attempts)
        assert_replayed(first, [a for a in attempts if a is not first])
        assert first.value == {"refunded": 1200, "order": "o-1"}
        await assert_count(store, 1, REFUNDS, "o-1")


@pytest.mark.parametrize("recover", ["retry", "sweep"])
async def test_a_crash_after_the_external_call_is_reconciled(
    kit_stores: TestStores, recover: str
) -> None:
    clock = FakeClock()
    async with await kit_stores.fresh(clock) as store:
        planner = Planner(await shop()(store, clock))
        action = planner.propose(*PROPOSALS[1])
        run = await crash_and_recover(planner, action, clock, recover=recover)
        outcomes = [a.outcome for a in run.attempts]
        # The email went out, the process died before its result was stored; within the
        # lease the retry is told "in progress"; then reconcile finds the email: never resent.
        if recover == "retry":
            assert outcomes == ["died", "in_flight", "executed", "replayed"], run.attempts
        else:
            assert run.swept == "recovered 1"
            assert outcomes == ["died", "in_flight", "replayed", "replayed"], run.attempts
        assert run.attempts[-1].value == {"sent_to": "ada@example.com"}
        await assert_count(store, 1, "SELECT count(*) FROM kit_outbox")


async def test_an_external_tool_without_reconcile_is_never_rerun(kit_stores: TestStores) -> None:
    clock = FakeClock()
    async with await kit_stores.fresh(clock) as store:
        planner = Planner(await shop(reconciles=False)(store, clock))
        action = planner.propose(*PROPOSALS[1])
        run = await crash_and_recover(planner, action, clock)
        assert [a.outcome for a in run.attempts] == [
            "died",
            "in_flight",
            "needs_review",
            "needs_review",
        ], run.attempts
        assert run.executions == 0
        await assert_count(store, 1, "SELECT count(*) FROM kit_outbox")


async def test_a_transactional_tool_killed_before_commit_runs_once_more(
    kit_stores: TestStores,
) -> None:
    clock = FakeClock()
    async with await kit_stores.fresh(clock) as store:
        planner = Planner(await shop()(store, clock))
        action = planner.propose(*PROPOSALS[0])
        began = time.monotonic()
        run = await crash_and_recover(planner, action, clock, fault=Fault.BEFORE_COMMIT)
        # The executor makes a duplicate wait 5 s for a running attempt; the kit does not wait
        # for a dead one on real time (on the fake clock its answer can only be "in progress").
        assert time.monotonic() - began < 2.5
        assert [a.outcome for a in run.attempts] == ["died", "in_flight", "executed", "replayed"]
        await assert_count(store, 1, REFUNDS, "o-1")


async def test_a_restarted_planner_and_a_regeneration_get_the_stored_result(
    kit_stores: TestStores,
) -> None:
    clock = FakeClock()
    async with await kit_stores.fresh(clock) as store:
        planner = Planner(await shop()(store, clock))
        action = planner.propose(*PROPOSALS[0])
        first = await planner.execute(action)
        # The planner process restarts: a new executor, nothing cached, the action proposed
        # again from what the planner persisted.
        restarted = Planner(await shop()(store, clock), number=2)
        again = await restarted.execute(restarted.restore(action))
        # The model regenerates: another wording of the reason, the same action id.
        regenerated = restarted.regenerate(action)
        assert regenerated.request["reason"] != action.request["reason"]
        assert regenerated.key == action.key
        reworded = await restarted.execute(regenerated)
        assert_replayed(first, [again, reworded])
        check_attempts(action.key, [first, again, reworded])
        await assert_count(store, 1, REFUNDS, "o-1")
        # A field the model rewords that the tool did not declare volatile: the kit names it.
        amount = await restarted.execute(restarted.regenerate(action, ["cents"]))
        assert amount.outcome == "conflict"
        with pytest.raises(AssertionError, match="must be volatile= on the tool"):
            check_attempts(action.key, [first, amount])


def test_a_correct_executor_passes(kit_stores: TestStores) -> None:
    check_actions(
        shop(),
        PROPOSALS,
        invariant=at_most_one_refund_per_order,
        final=one_refund_and_one_email,
        stores=kit_stores,
        max_examples=12 if kit_stores.kind == "sqlite" else 8,
    )


def test_a_tool_writing_outside_tx_is_caught_and_shrunk(kit_stores: TestStores) -> None:
    with pytest.raises(AssertionError) as caught:
        check_actions(
            shop(broken=True),
            PROPOSALS,
            invariant=at_most_one_refund_per_order,
            final=one_refund_and_one_email,
            stores=kit_stores,
            max_examples=60,
        )
    message = str(caught.value)
    assert "refunded twice: ['o-1']" in message, message
    shown = re.search(r"steps: (\[.*\])", message)
    assert shown is not None, message
    # Shrunk to the one step that shows it: the tool failed after its write, and the retry
    # of the recovery ran it again.
    assert shown.group(1) == "[execute(a0, handler_error)]", message


def test_a_reworded_field_the_tool_fingerprints_is_caught(tmp_path: Path) -> None:
    """The model words ``reason`` anew on every regeneration, but the tool forgot to declare
    it volatile: the regenerated call is refused as another action, and the kit says why.
    (The fingerprint is the executor's, the same on both stores: SQLite is enough.)"""
    with pytest.raises(AssertionError) as caught:
        check_actions(
            shop(volatile=()),
            PROPOSALS[:1],
            reworded={"refund_order": ["reason"]},
            stores=TestStores(tmp_path),
            max_steps=6,
            max_examples=30,
        )
    message = str(caught.value)
    assert "must be volatile= on the tool" in message, message
    shown = re.search(r"steps: (\[.*\])", message)
    assert shown is not None, message
    assert shown.group(1) == "[regenerate(a0)]", message


async def test_an_async_test_is_told_to_be_a_plain_one(kit_stores: TestStores) -> None:
    from receiver import ConfigurationError

    with pytest.raises(ConfigurationError, match="plain `def` test"):
        check_actions(shop(), PROPOSALS, stores=kit_stores)
