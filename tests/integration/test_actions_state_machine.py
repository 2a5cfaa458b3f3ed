"""A hypothesis state machine drives the action executor on a real store: executes with the same
or another request, reworded prose, transient failures, attempts that die mid-tool (their
transaction rolls back, their claim stays in flight), lease expiries, sweeper passes, and a
second executor with its own replay cache. After every step: each action's effect committed at
most once, exactly when the model says it completed, and every result byte-identical.

The machine owns an event loop and drives the async executor through it (rules are synchronous).
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from receiver import (
    ActionConflict,
    ActionInProgress,
    Actions,
    PostgresStore,
    Receiver,
    SQLiteStore,
    Store,
    ToolCall,
)
from receiver._store.base import Connection
from tests.conftest import truncate
from tests.support import EFFECTS_DDL, Clock, SimulatedCrash, ledger_clock

IDS = ["a-1", "a-2", "a-3"]
AMOUNTS = [100, 200]
LEASE = 30.0


@dataclass
class Known:
    amount: int
    state: str  # completed | in_flight (a dead attempt) | released
    lease_until: float = 0.0
    body: bytes | None = None


class ActionsMachine(RuleBasedStateMachine):
    kind = "sqlite"
    pg_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.clock = Clock()
        store: Store
        if self.kind == "postgresql":
            self.run(truncate(self.pg_url))
            store = PostgresStore(self.pg_url, max_size=10)
        else:
            store = SQLiteStore(Path(self.tmp.name) / "receipts.db")
        self.store = ledger_clock(store, self.clock)
        self.rx = Receiver(store, clock=self.clock, sweep_interval=None)
        self.run(self.rx.open())
        self.run(self._ddl())
        self.fail: set[str] = set()
        self.crash: set[str] = set()
        self.main = Actions(self.rx, lease=LEASE, wait=0.0)
        self.other = Actions(store, lease=LEASE, wait=0.0, metrics=False)
        for actions in (self.main, self.other):
            actions.add_tool("refund", self._refund, volatile=("prose",))
        self.known: dict[str, Known] = {}

    async def _ddl(self) -> None:
        async with self.store.acquire() as conn:
            await conn.execute(EFFECTS_DDL)

    async def _refund(self, call: ToolCall, tx: Connection) -> Any:
        action_id = call.action.action_id
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            "machine",
            action_id,
            call.fence,
            str(call.request["amount"]),
        )
        if action_id in self.crash:
            self.crash.discard(action_id)
            raise SimulatedCrash(action_id)
        if action_id in self.fail:
            self.fail.discard(action_id)
            raise RuntimeError("transient")
        return {"id": action_id, "amount": call.request["amount"], "fence": call.fence}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.rx.close())
        self.loop.close()
        self.tmp.cleanup()

    def _expect(self, action_id: str, amount: int) -> str:
        known = self.known.get(action_id)
        if known is None:
            return "run"
        if known.amount != amount:
            return "conflict"
        if known.state == "completed":
            return "replay"
        if known.state == "in_flight" and known.lease_until > self.clock.now:
            return "in_flight"
        return "run"

    @rule(
        action_id=st.sampled_from(IDS),
        amount=st.sampled_from(AMOUNTS),
        prose=st.text(max_size=10),
        outcome=st.sampled_from(["ok", "ok", "fail", "crash"]),
        other=st.booleans(),
    )
    def execute(self, action_id: str, amount: int, prose: str, outcome: str, other: bool) -> None:
        actions = self.other if other else self.main
        expected = self._expect(action_id, amount)
        if expected == "run" and outcome == "fail":
            self.fail.add(action_id)
        if expected == "run" and outcome == "crash":
            self.crash.add(action_id)
        request = {"amount": amount, "prose": prose}
        action = actions.propose("refund", scope="t", action_id=action_id, request=request)
        try:
            result = self.run(actions.execute(action))
        except ActionConflict:
            assert expected == "conflict"
            return
        except ActionInProgress:
            assert expected == "in_flight"
            return
        except RuntimeError:
            assert (expected, outcome) == ("run", "fail")
            self.known[action_id] = Known(amount, "released")
            return
        except SimulatedCrash:
            assert (expected, outcome) == ("run", "crash")
            self.known[action_id] = Known(amount, "in_flight", self.clock.now + LEASE)
            return
        if expected == "replay":
            assert result.replayed
            known = self.known[action_id]
            if known.body is None:  # completed by the sweeper: learnt from its first replay
                known.body = result.body
            assert result.body == known.body
            return
        assert expected == "run", expected
        assert not result.replayed
        self.known[action_id] = Known(amount, "completed", body=result.body)

    @rule()
    def lease_runs_out(self) -> None:
        self.clock.advance(LEASE + 1)

    @rule()
    def sweep(self) -> None:
        report = self.run(self.rx.sweep())
        recovered = 0
        for known in self.known.values():
            if known.state == "in_flight" and known.lease_until <= self.clock.now:
                known.state = "completed"
                known.body = None  # learnt on the next execute
                recovered += 1
        assert report.recovered == recovered

    def _committed(self) -> dict[str, int]:
        async def read() -> dict[str, int]:
            async with self.store.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT webhook_id, count(*) AS n FROM effects "
                    "WHERE provider = 'machine' GROUP BY webhook_id"
                )
            return {r["webhook_id"]: int(r["n"]) for r in rows}

        return dict(self.run(read()))

    @invariant()
    def each_action_committed_once_exactly_when_completed(self) -> None:
        committed = self._committed()
        for action_id in IDS:
            known = self.known.get(action_id)
            done = known is not None and known.state == "completed"
            assert committed.get(action_id, 0) == (1 if done else 0), (action_id, committed)

    @invariant()
    def never_a_double_execution(self) -> None:
        assert self.main.metrics is not None
        value = self.main.metrics.registry.get_sample_value(
            "receiver_action_double_executions_total", {"action": "refund"}
        )
        assert value == 0


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_actions_state_machine(kind: str, request: pytest.FixtureRequest) -> None:
    machine = type(f"ActionsMachine_{kind}", (ActionsMachine,), {"kind": kind})
    if kind == "postgresql":
        machine.pg_url = request.getfixturevalue("pg_url")
    machine.TestCase.settings = settings(
        max_examples=15,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
