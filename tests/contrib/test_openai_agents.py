"""receiver.contrib.openai_agents through the OpenAI Agents SDK's own run loop (Runner.run,
RunState) with a scripted model, on PostgreSQL and SQLite: a regenerated call, a run restarted
from its saved state and concurrent runs of one turn each take effect once; every outcome
reaches the model or stops the run as documented."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, RunState, Tool, UserError
from prometheus_client import CollectorRegistry

from examples.agents import openai_agents_example
from receiver import (
    ActionConflict,
    ActionFailed,
    ActionNeedsReview,
    Actions,
    ConfigurationError,
    Connection,
    Store,
    ToolCall,
)
from receiver.contrib.openai_agents import TURN_KEY, ActionStopped, AgentTurn, action_tool
from tests.contrib.openai_scripted import QUIET, ScriptedModel, call, say
from tests.support import EFFECTS_DDL

REFUND = {"order_id": "A-1001", "amount_cents": 2599}


class ProcessDied(Exception):
    """The process running the agent went away mid-turn."""


class Shop:
    """The agent's tools, each writing one effect row per run: ``refund`` through ``tx``
    (transactional), ``charge`` on a connection of its own (external)."""

    def __init__(self, actions: Actions) -> None:
        self.flaky = 0
        self.unstorable = False
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.pause = 0.0

        async def large(ctx: Any, arguments: dict[str, Any], call_id: str) -> bool:
            amount = arguments.get("amount_cents")
            return isinstance(amount, int) and amount > 10_000

        @action_tool(actions, volatile=("reason",), needs_approval=large)
        async def refund(
            call: ToolCall, tx: Connection, order_id: str, amount_cents: int, reason: str = ""
        ) -> dict[str, Any]:
            """Refund an order.

            Args:
                order_id: The order.
                amount_cents: How much, in cents.
                reason: Why, in the model's words.
            """
            self.started.set()
            if self.gate is not None:
                await asyncio.wait_for(self.gate.wait(), 5)  # a test that never opens it fails
            await asyncio.sleep(self.pause)
            if self.flaky > 0:
                self.flaky -= 1
                raise TimeoutError("the bank did not answer")
            if amount_cents <= 0:
                raise ActionFailed("a refund must be positive")
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
                "refund",
                call.action.key,
                call.fence,
                order_id,
            )
            return {"order_id": order_id, "refunded_cents": amount_cents}

        @action_tool(actions, effects="external")
        async def charge(call: ToolCall, tx: Connection, card: str, amount_cents: int) -> Any:
            """Charge a card."""
            async with actions.store.acquire() as conn:
                await conn.execute(
                    "INSERT INTO effects (provider, webhook_id, fence, note) "
                    "VALUES ($1, $2, $3, $4)",
                    "charge",
                    call.action.key,
                    call.fence,
                    card,
                )
            if self.unstorable:
                return {object()}  # the charge happened; its result cannot be stored
            return {"charged_cents": amount_cents}

        self.tools: list[Tool] = [refund, charge]

    def agent(self, model: ScriptedModel) -> Agent[Any]:
        return Agent(name="support", model=model, tools=self.tools)


async def setup(store: Store, **options: Any) -> tuple[Actions, Shop]:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    actions = Actions(store, registry=CollectorRegistry(), **options)
    return actions, Shop(actions)


def attempt(turn: str = "1", **ids: str) -> dict[str, Any]:
    """The context of one attempt of a turn (a new AgentTurn each time)."""
    names = {"tenant": "tenant-42", "conversation": "conv-7"} | ids
    return {TURN_KEY: AgentTurn.start(turn=turn, **names)}


async def effects(store: Store, tool: str = "refund") -> list[str]:
    async with store.acquire() as conn:
        rows = await conn.fetch(
            "SELECT webhook_id FROM effects WHERE provider = $1 ORDER BY webhook_id", tool
        )
    return [r["webhook_id"] for r in rows]


async def receipts(store: Store) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM receiver_receipts"))


# -- where the key comes from ---------------------------------------------------------------------


async def test_a_regenerated_call_gets_the_stored_result(store: Store) -> None:
    """The model API fails after the refund; the turn runs again and the model regenerates the
    call with another call id and other words: one refund, the first result, byte for byte."""
    _, shop = await setup(store)
    model = ScriptedModel(
        [call("call_a1", "refund", **REFUND, reason="Arrived broken.")],
        ConnectionError("the model API went away"),
        [call("call_b7", "refund", **REFUND, reason="  The customer reports damage. ")],
        [say("Refunded.")],
    )
    agent = shop.agent(model)
    with pytest.raises(ConnectionError):
        await Runner.run(agent, "A-1001 is broken", context=attempt(), run_config=QUIET)
    first = model.tool_outputs()["call_a1"]
    result = await Runner.run(agent, "A-1001 is broken", context=attempt(), run_config=QUIET)
    assert result.final_output == "Refunded."
    assert model.tool_outputs() == {"call_b7": first}
    assert json.loads(first) == {"order_id": "A-1001", "refunded_cents": 2599}
    # One row, keyed by the turn and the call's ordinal: no call id, no model text in it.
    assert await effects(store) == ["tenant-42:refund:conv-7%2F1%2F1:v1"]


async def test_calls_of_one_turn_are_numbered_per_tool_and_turns_apart(store: Store) -> None:
    _, shop = await setup(store)
    other = {"order_id": "A-1002", "amount_cents": 100}
    model = ScriptedModel(
        [call("c1", "refund", **REFUND), call("c2", "refund", **other)],
        [say("Both refunded.")],
        [call("c1", "refund", **REFUND)],  # turn 2 reuses a call id: a new action all the same
        [say("Refunded again, as asked.")],
    )
    await Runner.run(shop.agent(model), "refund both", context=attempt("1"), run_config=QUIET)
    await Runner.run(shop.agent(model), "once more", context=attempt("2"), run_config=QUIET)
    assert await effects(store) == [
        "tenant-42:refund:conv-7%2F1%2F1:v1",
        "tenant-42:refund:conv-7%2F1%2F2:v1",
        "tenant-42:refund:conv-7%2F2%2F1:v1",
    ]


async def test_a_run_restarted_from_its_saved_state_after_the_effect(store: Store) -> None:
    """A large refund waits for approval; the state is saved as JSON. Approved and resumed, the
    refund runs and the process dies; restarted from the same JSON, approved again, the SDK runs
    the call again and it gets the stored result."""
    _, shop = await setup(store)
    big = {"order_id": "B-2002", "amount_cents": 48_000, "reason": "Lost."}
    model = ScriptedModel(
        [call("call_c1", "refund", **big)],
        ProcessDied("the process died"),
        [say("Refunded B-2002.")],
    )
    agent = shop.agent(model)
    paused = await Runner.run(agent, "refund B-2002", context=attempt(), run_config=QUIET)
    assert paused.interruptions
    assert await effects(store) == []
    saved = paused.to_state().to_json()
    outputs = []
    for _ in range(2):
        state = await RunState.from_json(agent, json.loads(json.dumps(saved)))
        for pending in state.get_interruptions():
            state.approve(pending)
        try:
            result = await Runner.run(agent, state, run_config=QUIET)
        except ProcessDied:
            outputs.append(model.tool_outputs()["call_c1"])
        else:
            outputs.append(model.tool_outputs()["call_c1"])
            assert result.final_output == "Refunded B-2002."
    assert outputs[0] == outputs[1]
    assert await effects(store) == ["tenant-42:refund:conv-7%2F1%2F1:v1"]


async def test_a_call_run_again_after_a_restore_keeps_its_number() -> None:
    """The numbering as RunState.to_json() saves it: a call it already numbered keeps its
    number when the SDK runs it again; a new call after the restore gets the next one."""
    turn = AgentTurn.start(tenant="t", conversation="c", turn=1)
    assert (turn.number("refund", "call_x"), turn.number("refund", "call_y")) == (1, 2)
    restored = AgentTurn.restore(json.loads(json.dumps(turn)))
    assert restored.number("refund", "call_x") == 1
    assert restored.number("refund", "call_z") == 3
    assert restored.number("charge", "call_z") == 1


async def test_concurrent_runs_of_one_turn_take_effect_once(store: Store) -> None:
    """Six workers run the same turn at once; their model answers meet at one barrier: one
    refund, and every run's model sees the same result."""
    _, shop = await setup(store)
    shop.pause = 0.05
    barrier = asyncio.Barrier(6)

    def model(n: int) -> ScriptedModel:
        async def together() -> list[Any]:
            await barrier.wait()
            return [call(f"call_{n}", "refund", **REFUND, reason=f"worker {n}")]

        return ScriptedModel(together, [say("done")])

    models = [model(n) for n in range(6)]
    await asyncio.gather(
        *(Runner.run(shop.agent(m), "refund", context=attempt(), run_config=QUIET) for m in models)
    )
    seen = {out for n, m in enumerate(models) for out in [m.tool_outputs()[f"call_{n}"]]}
    assert seen == {'{"order_id":"A-1001","refunded_cents":2599}'}
    assert len(await effects(store)) == 1


async def test_the_tool_runs_from_its_stored_request_without_the_sdk(store: Store) -> None:
    """What the sweeper's recovery does: the executor runs the tool from the request stored in
    the ledger, validated into the same arguments, with no SDK run around it."""
    actions, _ = await setup(store)
    action = actions.propose(
        "refund", scope="tenant-42", action_id="conv-7/9/1", request={**REFUND, "reason": "x"}
    )
    assert (await actions.execute(action)).value == {"order_id": "A-1001", "refunded_cents": 2599}
    assert await effects(store) == [action.key]


# -- what the model sees, what stops the run ------------------------------------------------------


async def test_a_tool_error_is_a_message_and_the_retry_is_the_same_action(store: Store) -> None:
    """The tool raises (claim released): the model reads that calling again is safe; its
    retry, with another call id, takes the same number, so it is the same action."""
    _, shop = await setup(store)
    shop.flaky = 1
    model = ScriptedModel(
        [call("c1", "refund", **REFUND)],
        [call("c2", "refund", **REFUND, reason="retrying")],
        [say("Refunded.")],
    )
    await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    message = model.tool_outputs(1)["c1"]
    assert "did not complete (TimeoutError: the bank did not answer)" in message
    assert "Calling it again with the same arguments is safe" in message
    assert json.loads(model.tool_outputs(2)["c2"]) == {"order_id": "A-1001", "refunded_cents": 2599}
    assert await effects(store) == ["tenant-42:refund:conv-7%2F1%2F1:v1"]


async def test_in_progress_is_a_message_and_the_retry_gets_the_result(store: Store) -> None:
    """Another attempt holds the action: the model is told to call again, and its retry (same
    number) gets that attempt's result instead of refunding a second time."""
    actions, shop = await setup(store, wait=0.0)
    shop.gate = asyncio.Event()
    held = actions.propose(
        "refund",
        scope="tenant-42",
        action_id=AgentTurn.start(tenant="t", conversation="conv-7", turn="1").action_id(1),
        request={**REFUND, "reason": "worker"},
    )
    other = asyncio.create_task(actions.execute(held))
    await shop.started.wait()

    async def later() -> list[Any]:
        shop.gate.set()  # type: ignore[union-attr]
        await other
        return [call("c2", "refund", **REFUND)]

    model = ScriptedModel([call("c1", "refund", **REFUND)], later, [say("Refunded.")])
    await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    assert "Another attempt is still carrying out this action" in model.tool_outputs(1)["c1"]
    assert model.tool_outputs(2)["c2"] == (await other).body.decode()
    assert len(await effects(store)) == 1


async def test_a_failed_action_is_a_message_and_stays_failed(store: Store) -> None:
    _, shop = await setup(store)
    refund = {"order_id": "A-1001", "amount_cents": 0}
    model = ScriptedModel(
        [call("c1", "refund", **refund)],
        ConnectionError("the model API went away"),
        [call("c9", "refund", **refund, reason="regenerated")],
        [say("Could not refund.")],
    )
    with pytest.raises(ConnectionError):
        await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    failed = model.tool_outputs()["c1"]
    assert failed == "The action failed and was not carried out: a refund must be positive"
    await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    assert model.tool_outputs()["c9"] == failed  # stored: the regenerated call reads it again
    assert await effects(store) == []


async def test_needs_review_stops_the_run(store: Store) -> None:
    """The external charge happened and its result cannot be stored: a person must look. The
    run stops (never a message the model could retry around), and stays stopped."""
    actions, shop = await setup(store)
    shop.unstorable = True
    card = {"card": "tok_visa", "amount_cents": 500}
    model = ScriptedModel(
        [call("c1", "charge", **card)],
        [call("c2", "charge", **card)],
        [say("never reached")],
    )
    for _ in range(2):  # a restart of the turn stops at the same action
        with pytest.raises(ActionStopped) as stopped:
            await Runner.run(shop.agent(model), "charge", context=attempt(), run_config=QUIET)
        assert stopped.value.reason == "needs_review"
        assert isinstance(stopped.value.__cause__, ActionNeedsReview)
    assert len(model.inputs) == 2  # one request per run: the model heard nothing back
    assert len(model.steps) == 1
    state = await actions.inspect(stopped.value.key)
    assert state is not None
    assert state.needs_review
    assert len(await effects(store, "charge")) == 1


async def test_a_regenerated_call_with_other_effects_stops_the_run(store: Store) -> None:
    _, shop = await setup(store)
    model = ScriptedModel(
        [call("c1", "refund", **REFUND)],
        ConnectionError("the model API went away"),
        [call("c9", "refund", order_id="A-1001", amount_cents=9999)],
    )
    with pytest.raises(ConnectionError):
        await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    with pytest.raises(ActionStopped) as stopped:
        await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    assert stopped.value.reason == "conflict"
    assert isinstance(stopped.value.__cause__, ActionConflict)
    assert len(await effects(store)) == 1


# -- bad input: a clear error, the store untouched ----------------------------------------------


async def test_bad_arguments_are_a_message_and_store_nothing(store: Store) -> None:
    _, shop = await setup(store)
    model = ScriptedModel(
        [call("c1", "refund", order_id="A-1001", amount_cents="lots")],
        [call("c2", "refund", **REFUND)],
        [say("Refunded.")],
    )
    await Runner.run(shop.agent(model), "refund", context=attempt(), run_config=QUIET)
    message = model.tool_outputs(1)["c1"]
    assert message.startswith("The tool's arguments are invalid; nothing was done.")
    assert "amount_cents" in message
    assert "lots" not in message  # the model's values are not echoed
    # The corrected call is the turn's first refund.
    assert await effects(store) == ["tenant-42:refund:conv-7%2F1%2F1:v1"]


async def test_without_a_turn_the_run_stops_before_the_store(store: Store) -> None:
    _, shop = await setup(store)
    model = ScriptedModel([call("c1", "refund", **REFUND)])
    with pytest.raises(UserError, match=r"AgentTurn\.start"):
        await Runner.run(shop.agent(model), "refund", context={}, run_config=QUIET)
    assert await receipts(store) == 0


async def test_a_turn_reused_by_another_run_is_refused(store: Store) -> None:
    """Retrying with the context a failed attempt numbered would make the regenerated call a
    new action (number 2): refused, with what to do instead."""
    _, shop = await setup(store)
    model = ScriptedModel(
        [call("c1", "refund", **REFUND)],
        ConnectionError("the model API went away"),
        [call("c9", "refund", **REFUND)],
    )
    context = attempt()
    with pytest.raises(ConnectionError):
        await Runner.run(shop.agent(model), "refund", context=context, run_config=QUIET)
    with pytest.raises(UserError, match="used by another run"):
        await Runner.run(shop.agent(model), "refund", context=context, run_config=QUIET)
    assert len(await effects(store)) == 1
    assert await receipts(store) == 1


def test_turn_ids_and_tool_signatures_are_checked_up_front(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="conversation"):
        AgentTurn.start(tenant="t", conversation=" ", turn=1)
    with pytest.raises(UserError, match="short ids"):
        AgentTurn.start(tenant="t", conversation="c" * 200, turn=1)
    from receiver import SQLiteStore

    actions = Actions(SQLiteStore(tmp_path / "x.db"), metrics=False)

    async def no_tx(call: ToolCall) -> None: ...

    async def typo(call: ToolCall, tx: Connection, order_id: str) -> None: ...

    with pytest.raises(ConfigurationError, match=r"\(call, tx"):
        action_tool(actions)(no_tx)
    with pytest.raises(ConfigurationError, match="not parameters"):
        action_tool(actions, volatile=("reasn",))(typo)


# -- the worked example ---------------------------------------------------------------------------


async def test_the_example_takes_each_effect_once(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    async with store.acquire() as conn:  # PostgreSQL keeps tables between tests
        for table in ("oa_refunds", "oa_outbox"):
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
    assert await openai_agents_example.demo(store.url) == 0
    shown = capsys.readouterr().out
    assert "call_a1 -> call_b7" in shown
    assert "tenant-42:refund_order:conv-7%2F1%2F1:v1" in shown
    assert 'effects: {"refunds": 2, "outbox": 1}' in shown


async def test_an_integer_the_ledger_cannot_keep_is_a_message_and_stores_nothing(
    store: Store,
) -> None:
    _, shop = await setup(store)
    model = ScriptedModel(
        [call("c1", "charge", card="4242", amount_cents=10**30)],
        [call("c2", "charge", card="4242", amount_cents=500)],
        [say("Charged.")],
    )
    await Runner.run(shop.agent(model), "charge", context=attempt(), run_config=QUIET)
    message = model.tool_outputs(1)["c1"]
    assert message.startswith("The tool's arguments are invalid; nothing was done.")
    assert "64-bit" in message
    # The corrected call is the turn's first charge.
    assert await effects(store, "charge") == ["tenant-42:charge:conv-7%2F1%2F1:v1"]
