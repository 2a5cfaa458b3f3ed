"""The action executor on the real ledger (PostgreSQL and SQLite): duplicate, race, drift,
failure semantics, interrupted attempts and the sweeper."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from receiver import (
    RUN_AGAIN,
    Action,
    ActionConflict,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    Actions,
    ConfigurationError,
    Receiver,
    Store,
    ToolCall,
    action_key,
)
from receiver._store.base import Connection
from tests.support import EFFECTS_DDL, Clock, SimulatedCrash, ledger_clock

TENANT = "tenant-42"


class Shop:
    """Real tools: ``refund`` writes a business row through ``tx``; ``charge`` is external (an
    in-memory "payment API" that dedups on the downstream key, as Stripe does)."""

    def __init__(self, actions: Actions) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self.fail: collections.Counter[str] = collections.Counter()
        self.crash: set[str] = set()
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.charges: dict[str, dict[str, Any]] = {}  # downstream key -> charge
        self.keys: list[str] = []
        self.reconciled = 0

        @actions.tool("refund", volatile=("explanation", "meta.at"))
        async def refund(call: ToolCall, tx: Connection) -> Any:
            self.runs[call.action.key] += 1
            self.started.set()
            if self.gate is not None:
                await self.gate.wait()
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
                "refund",
                call.action.key,
                call.fence,
                str(call.request["amount"]),
            )
            if call.action.key in self.crash:
                self.crash.discard(call.action.key)
                raise SimulatedCrash(call.action.key)
            if self.fail[call.action.key] > 0:
                self.fail[call.action.key] -= 1
                raise RuntimeError("the bank timed out")
            if call.request["amount"] <= 0:
                raise ActionFailed("a refund must be positive")
            return {"refunded": call.request["amount"], "order": call.request["order"]}

        async def find_charge(call: ToolCall) -> Any:
            self.reconciled += 1
            charge = self.charges.get(call.downstream_key)
            return RUN_AGAIN if charge is None else {"charge": charge["id"], "reconciled": True}

        @actions.tool("charge", effects="external", reconcile=find_charge)
        async def charge(call: ToolCall, tx: Connection) -> Any:
            self.runs[call.action.key] += 1
            self.keys.append(call.downstream_key)
            made = self.charges.setdefault(
                call.downstream_key, {"id": f"ch_{len(self.charges) + 1}"}
            )
            if call.action.key in self.crash:  # the call happened; the result is not stored
                self.crash.discard(call.action.key)
                raise SimulatedCrash(call.action.key)
            return {"charge": made["id"]}

        @actions.tool("email", effects="external")
        async def email(call: ToolCall, tx: Connection) -> Any:
            self.runs[call.action.key] += 1
            if call.action.key in self.crash:
                self.crash.discard(call.action.key)
                raise SimulatedCrash(call.action.key)
            return {"sent": True}


async def setup(store: Store, **options: Any) -> tuple[Actions, Shop]:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    actions = Actions(store, registry=CollectorRegistry(), **options)
    return actions, Shop(actions)


async def committed(store: Store, key: str) -> int:
    async with store.acquire() as conn:
        n = await conn.fetchval("SELECT count(*) FROM effects WHERE webhook_id = $1", key)
    return int(n)


def refund(actions: Actions, action_id: str = "order-8891", **request: Any) -> Action:
    body = {"order": action_id, "amount": 1200, "explanation": "the customer asked"} | request
    return actions.propose("refund", scope=TENANT, action_id=action_id, request=body)


def metric(actions: Actions, name: str, **labels: str) -> float:
    assert actions.metrics is not None
    value = actions.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_the_key_is_scope_action_object_version() -> None:
    assert action_key("tenant-42", "refund", "order-8891") == "tenant-42:refund:order-8891:v1"
    # A colon inside a part cannot make two actions share a key.
    assert action_key("a:b", "refund", "c") != action_key("a", "refund", "b:c")


async def test_duplicate_one_effect_byte_identical_result(store: Store) -> None:
    actions, shop = await setup(store)
    action = refund(actions)
    first = await actions.execute(action)
    again = await actions.execute(refund(actions))  # proposed again after a restart
    assert (first.replayed, again.replayed) == (False, True)
    assert again.body == first.body
    assert first.value == {"refunded": 1200, "order": "order-8891"}
    assert shop.runs[action.key] == 1
    assert await committed(store, action.key) == 1
    assert metric(actions, "receiver_action_executions_total", action="refund") == 1
    assert metric(actions, "receiver_action_replays_total", action="refund") == 1


async def test_race_one_tool_run(store: Store) -> None:
    actions, shop = await setup(store, wait=30.0)
    action = refund(actions, "order-race")
    barrier = asyncio.Barrier(100)

    async def one() -> bytes:
        await barrier.wait()
        return (await actions.execute(action)).body

    bodies = await asyncio.gather(*(one() for _ in range(100)))
    assert shop.runs[action.key] == 1
    assert await committed(store, action.key) == 1
    assert len(set(bodies)) == 1
    assert metric(actions, "receiver_action_double_executions_total", action="refund") == 0


async def test_reworded_prose_keeps_one_key(store: Store) -> None:
    actions, shop = await setup(store)
    first = refund(
        actions,
        explanation="Refunding because the parcel was lost.",
        meta={"at": "2026-12-03T08:59:00Z"},
    )
    second = refund(
        actions,
        explanation="As requested, I am issuing the refund now.",
        order="  order-8891 ",
        meta={"at": "2026-12-03T09:00:00Z"},
    )
    assert (first.key, first.fingerprint) == (second.key, second.fingerprint)
    await actions.execute(first, turn="turn-1")
    assert (await actions.execute(second, turn="turn-1")).replayed
    assert shop.runs[first.key] == 1
    assert metric(actions, "receiver_action_turn_keys_total", action="refund") == 1
    assert metric(actions, "receiver_action_max_keys_per_turn", action="refund") == 1


async def test_changed_effect_under_the_same_action_id_is_a_conflict(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    actions, shop = await setup(store)
    await actions.execute(refund(actions))
    with pytest.raises(ActionConflict):
        await actions.execute(refund(actions, amount=12000))
    assert shop.runs[refund(actions).key] == 1
    assert await committed(store, refund(actions).key) == 1
    assert metric(actions, "receiver_action_conflicts_total", action="refund") == 1
    assert any(r.getMessage().startswith("ALERT:") for r in caplog.records)


async def test_keys_per_turn_counts_distinct_keys(store: Store) -> None:
    actions, _ = await setup(store)
    for n in range(3):  # a planner that mints a new action id on every retry of one intent
        await actions.execute(refund(actions, f"order-{n}"), turn="turn-7")
    await actions.execute(refund(actions, "order-x"), turn="turn-8")
    assert metric(actions, "receiver_action_turns_total", action="refund") == 2
    assert metric(actions, "receiver_action_turn_keys_total", action="refund") == 4
    assert metric(actions, "receiver_action_max_keys_per_turn", action="refund") == 3


async def test_transient_failure_releases_then_runs_again(store: Store) -> None:
    actions, shop = await setup(store)
    action = refund(actions)
    shop.fail[action.key] = 1
    with pytest.raises(RuntimeError, match="bank timed out"):
        await actions.execute(action)
    assert await committed(store, action.key) == 0  # rolled back with the release
    result = await actions.execute(action)
    assert not result.replayed
    assert shop.runs[action.key] == 2
    assert await committed(store, action.key) == 1


async def test_permanent_failure_is_stored_and_raised_again(store: Store) -> None:
    actions, shop = await setup(store)
    action = refund(actions, amount=-5)
    with pytest.raises(ActionFailed, match="must be positive"):
        await actions.execute(action)
    with pytest.raises(ActionFailed, match="must be positive"):
        await actions.execute(action)
    assert shop.runs[action.key] == 1
    assert await committed(store, action.key) == 0


async def test_a_duplicate_waits_for_the_first_result(store: Store) -> None:
    actions, shop = await setup(store, wait=30.0)
    shop.gate = asyncio.Event()
    action = refund(actions)
    first = asyncio.create_task(actions.execute(action))
    await shop.started.wait()
    second = asyncio.create_task(actions.execute(action))
    await asyncio.sleep(0.05)
    assert not second.done()
    shop.gate.set()
    assert (await second).body == (await first).body
    assert shop.runs[action.key] == 1


async def test_a_duplicate_gets_in_progress_after_the_bounded_wait(store: Store) -> None:
    actions, shop = await setup(store, wait=0.2)
    shop.gate = asyncio.Event()
    action = refund(actions)
    first = asyncio.create_task(actions.execute(action))
    await shop.started.wait()
    with pytest.raises(ActionInProgress) as caught:
        await actions.execute(action)
    assert caught.value.retry_after >= 1
    shop.gate.set()
    await first
    assert shop.runs[action.key] == 1


async def test_interrupted_transactional_tool_runs_again_after_the_lease(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions, shop = await setup(store, lease=30.0)
    action = refund(actions)
    shop.crash.add(action.key)
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    actions.wait = 0.1
    with pytest.raises(ActionInProgress):  # the dead attempt's lease is still live
        await actions.execute(action)
    clock.advance(31)
    assert not (await actions.execute(action)).replayed
    assert shop.runs[action.key] == 2
    assert await committed(store, action.key) == 1
    labels = {"action": "refund", "result": "recovered"}
    assert metric(actions, "receiver_action_stale_claims_total", **labels) == 1


async def test_interrupted_external_tool_is_reconciled_never_rerun(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions, shop = await setup(store, lease=30.0)
    action = actions.propose("charge", scope=TENANT, action_id="inv-1", request={"amount": 5})
    shop.crash.add(action.key)
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    clock.advance(31)
    result = await actions.execute(action)
    assert result.value == {"charge": "ch_1", "reconciled": True}
    assert (shop.runs[action.key], shop.reconciled, len(shop.charges)) == (1, 1, 1)
    assert (await actions.execute(action)).body == result.body


async def test_external_tool_whose_call_never_happened_runs_again_with_the_same_downstream_key(
    store: Store,
) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions, shop = await setup(store, lease=30.0)
    action = actions.propose("charge", scope=TENANT, action_id="inv-2", request={"amount": 5})
    shop.charges.clear()
    shop.crash.add(action.key)
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    shop.charges.clear()  # the downstream never saw the call: reconcile says RUN_AGAIN
    clock.advance(31)
    await actions.execute(action)
    assert shop.runs[action.key] == 2
    assert len(set(shop.keys)) == 1  # both attempts sent one downstream key


async def test_interrupted_external_tool_without_reconcile_is_marked_for_review(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions, shop = await setup(store, lease=30.0)
    action = actions.propose("email", scope=TENANT, action_id="mail-1", request={"to": "a@b"})
    shop.crash.add(action.key)
    with pytest.raises(SimulatedCrash):
        await actions.execute(action)
    clock.advance(31)
    with pytest.raises(ActionNeedsReview):
        await actions.execute(action)
    with pytest.raises(ActionNeedsReview):
        await actions.execute(action)
    assert shop.runs[action.key] == 1
    assert metric(actions, "receiver_action_stale_claims_total", action="email", result="failed")
    assert any("ALERT:" in r.getMessage() for r in caplog.records)


async def test_the_receivers_sweeper_recovers_stale_action_claims(store: Store) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    rx = Receiver(store, clock=clock, sweep_interval=None)
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    actions = Actions(rx, lease=30.0)
    shop = Shop(actions)
    transactional = refund(actions)
    external = actions.propose("email", scope=TENANT, action_id="mail-2", request={"to": "x"})
    for action in (transactional, external):
        shop.crash.add(action.key)
        with pytest.raises(SimulatedCrash):
            await actions.execute(action)
    clock.advance(31)
    report = await rx.sweep()
    assert (report.recovered, report.failed) == (1, 1)
    assert await committed(store, transactional.key) == 1
    assert (await actions.execute(transactional)).replayed
    with pytest.raises(ActionNeedsReview):
        await actions.execute(external)
    assert shop.runs[transactional.key] == 2
    assert shop.runs[external.key] == 1
    assert rx.metrics is not None  # the executor's metrics are in the receiver's registry
    labels = {"action": "email", "result": "failed"}
    assert rx.metrics.registry.get_sample_value("receiver_action_stale_claims_total", labels) == 1


async def test_a_tool_that_outlives_its_lease_is_fenced_out_and_counted(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    actions = Actions(store, registry=CollectorRegistry(), lease=30.0, wait=0.0)
    release_first = asyncio.Event()
    started = asyncio.Event()
    runs = 0

    @actions.tool("slow")
    async def slow(call: ToolCall, tx: Connection) -> Any:
        nonlocal runs
        runs += 1
        if call.fence == 1:
            started.set()
            await release_first.wait()  # stalls past its lease
        return {"fence": call.fence}

    action = actions.propose("slow", scope=TENANT, action_id="s-1", request={})
    first = asyncio.create_task(actions.execute(action))
    await started.wait()
    clock.advance(31)
    second = await actions.execute(action)  # the lease ran out: taken over with fence 2
    assert second.value == {"fence": 2}
    release_first.set()
    with pytest.raises(ActionInProgress):  # its completion is refused by the fence
        await first
    assert runs == 2
    assert (await actions.execute(action)).body == second.body
    assert metric(actions, "receiver_action_double_executions_total", action="slow") == 1
    assert any("ALERT: double execution" in r.getMessage() for r in caplog.records)


async def test_one_executor_per_receiver(store: Store) -> None:
    rx = Receiver(store, sweep_interval=None)
    Actions(rx)
    with pytest.raises(ConfigurationError, match="already has an action executor"):
        Actions(rx)


async def test_another_executor_replays_from_the_ledger(store: Store) -> None:
    """A second executor (another process's worth of replay cache) answers from the ledger."""
    actions, shop = await setup(store)
    first = await actions.execute(refund(actions))
    other, other_shop = await setup(store)
    again = await other.execute(refund(other))
    assert again.replayed
    assert again.body == first.body
    with pytest.raises(ActionConflict):
        await other.execute(refund(other, amount=1))
    assert shop.runs[refund(actions).key] == 1
    assert other_shop.runs[refund(actions).key] == 0


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("a message that cannot be read")


class Unprintably(ActionFailed):
    def __str__(self) -> str:
        raise RuntimeError("a message that cannot be read")


async def test_an_exception_whose_message_cannot_be_read_gives_the_key_back(
    store: Store,
) -> None:
    actions = Actions(store, registry=CollectorRegistry(), wait=0.1)
    runs = 0

    @actions.tool("odd")
    async def odd(call: ToolCall, tx: Connection) -> Any:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise Unprintable()
        return {"ran": runs}

    action = actions.propose("odd", scope=TENANT, action_id="a-1", request={})
    with pytest.raises(Unprintable):  # the tool's own exception, not the one from its __str__
        await actions.execute(action)
    state = await actions.inspect(action)
    assert state is not None
    assert state.state == "released"
    assert state.attempts[0].error == "Unprintable: (its message could not be read)"
    assert (await actions.execute(action)).value == {"ran": 2}  # not "in progress"


async def test_action_failed_with_an_unreadable_message_is_stored_as_failed(store: Store) -> None:
    actions = Actions(store, registry=CollectorRegistry(), wait=0.1)

    @actions.tool("refusing")
    async def refusing(call: ToolCall, tx: Connection) -> Any:
        raise Unprintably()

    action = actions.propose("refusing", scope=TENANT, action_id="a-1", request={})
    with pytest.raises(Unprintably):
        await actions.execute(action)
    with pytest.raises(ActionFailed, match="could not be read"):
        await actions.execute(action)
