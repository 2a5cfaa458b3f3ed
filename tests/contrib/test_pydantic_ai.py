"""receiver.contrib.pydantic_ai through Pydantic AI's own run loop and FunctionModel (no network,
no model, no key), on PostgreSQL and SQLite: a regenerated call, a run restarted from its message
history, concurrent runs of one turn and a retry prompt each take effect once; every executor
outcome reaches the run as Pydantic AI expects it."""

import asyncio
import dataclasses
import datetime as dt
import decimal
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic_ai import Agent, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.agents import pydantic_ai_example
from receiver import (
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionNeedsReview,
    Actions,
    ConfigurationError,
    Connection,
    Store,
    ToolCall,
)
from receiver.contrib.pydantic_ai import METADATA_KEY, ActionTools, Turn
from tests.support import EFFECTS_DDL, Clock, SimulatedCrash, ledger_clock

TURN = Turn(scope="tenant-42/conv-7", turn=3)
PROMPT = "Order A-1001 arrived broken, please refund it."
Script = Callable[[list[ModelMessage], AgentInfo], Any]


class Shop:
    """The tools under test: each effect is a row in the tests' ``effects`` table, and every
    body invocation is counted, whether or not it committed."""

    def __init__(self, actions: Actions) -> None:
        self.actions = actions
        self.bodies: list[str] = []
        self.tools: ActionTools[Turn] = ActionTools(actions)
        self.gate: asyncio.Event | None = None  # set: the refund body waits for it
        self.started = asyncio.Event()  # a refund body began

        @self.tools.tool(volatile=("reason",))
        async def refund(
            call: ToolCall, tx: Connection, order: str, cents: int, reason: str = ""
        ) -> dict[str, Any]:
            """Refund an order."""
            self.bodies.append(order)
            self.started.set()
            if self.gate is not None:
                await self.gate.wait()
            if cents > 10_000:
                raise ActionFailed("over the refund limit of 10000 cents")
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
                "refund",
                call.action.key,
                call.fence,
                order,
            )
            return {"refunded": cents, "order": order, "id": call.downstream_key}

        @self.tools.tool(effects="external")
        async def ship(
            call: ToolCall, tx: Connection, order: str, on: dt.date, value: decimal.Decimal
        ) -> object:
            """Ship a replacement (an outside carrier; writes on its own connection)."""
            self.bodies.append(order)
            async with actions.store.acquire() as conn:
                await conn.execute(
                    "INSERT INTO effects (provider, webhook_id, fence, note) "
                    "VALUES ($1, $2, $3, $4)",
                    "ship",
                    call.action.key,
                    call.fence,
                    f"{on.isoformat()} {value}",
                )
            if order == "opaque":
                return object()  # the carrier's SDK object: cannot be stored
            return {"shipped": order, "on": on, "value": value}

    def agent(self, script: Script) -> Agent[Turn, str]:
        return Agent(FunctionModel(script), deps_type=Turn, toolsets=[self.tools.toolset])


async def shop(store: Store, **options: Any) -> Shop:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    return Shop(Actions(store, metrics=False, **options))


async def effects(store: Store, provider: str = "refund") -> list[tuple[str, str]]:
    async with store.acquire() as conn:
        rows = await conn.fetch(
            "SELECT webhook_id, note FROM effects WHERE provider = $1 ORDER BY note", provider
        )
    return [(r["webhook_id"], r["note"]) for r in rows]


def responses(messages: Sequence[ModelMessage]) -> int:
    return sum(isinstance(m, ModelResponse) for m in messages)


def returns(messages: Sequence[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def calls(messages: Sequence[ModelMessage]) -> list[ToolCallPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart)
    ]


def refund_then_done(reason: str, cents: int = 2599) -> Script:
    """A model that asks for the refund (a fresh tool_call_id each time, as models do), then
    answers with text."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not returns(messages[-1:]):
            args = {"order": "A-1001", "cents": cents, "reason": reason}
            return ModelResponse(parts=[ToolCallPart("refund", args)])
        return ModelResponse(parts=[TextPart("Refunded.")])

    return script


async def test_a_regenerated_call_takes_effect_once(store: Store) -> None:
    s = await shop(store)
    first = await s.agent(refund_then_done("Damaged on arrival.")).run(PROMPT, deps=TURN)
    # The user presses "regenerate": the same turn, from the history before it; the model
    # answers again with another tool_call_id and other wording.
    again = await s.agent(refund_then_done("  So sorry! Refunding now. ")).run(PROMPT, deps=TURN)

    (a,), (b,) = returns(first.all_messages()), returns(again.all_messages())
    first_id, again_id = (calls(r.all_messages())[0].tool_call_id for r in (first, again))
    assert first_id != again_id  # the model's own id changed: it cannot be the key
    assert a.metadata[METADATA_KEY]["key"] == b.metadata[METADATA_KEY]["key"]
    assert a.metadata[METADATA_KEY]["key"] == "tenant-42%2Fconv-7:refund:3.1:v1"
    assert b.content == a.content  # the stored result
    assert (a.metadata[METADATA_KEY]["replayed"], b.metadata[METADATA_KEY]["replayed"]) == (
        False,
        True,
    )
    assert s.bodies == ["A-1001"]
    assert await effects(store) == [("tenant-42%2Fconv-7:refund:3.1:v1", "A-1001")]


@pytest.mark.parametrize("saved", ["after_the_call", "before_the_turn"])
async def test_a_run_restarted_from_its_history_after_the_effect(store: Store, saved: str) -> None:
    s = await shop(store)
    history: list[ModelMessage] = []

    def crashes_after_the_tool(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if returns(messages[-1:]):
            raise ConnectionResetError("the process died after the tool's effect")
        response = ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1001", "cents": 2599})])
        history[:] = [*messages, response]  # what the app persisted after the model answered
        return response

    with pytest.raises(ConnectionResetError):
        await s.agent(crashes_after_the_tool).run(PROMPT, deps=TURN)
    assert len(await effects(store)) == 1

    resumed = s.agent(refund_then_done("reworded on restart"))
    if saved == "after_the_call":
        # Pydantic AI runs the saved response's pending call (the same tool_call_id) again.
        result = await resumed.run(None, message_history=history, deps=TURN)
    else:
        result = await resumed.run(PROMPT, message_history=history[:-2], deps=TURN)

    (answer,) = returns(result.new_messages())
    assert answer.metadata[METADATA_KEY]["replayed"] is True
    stored = await s.actions.inspect(answer.metadata[METADATA_KEY]["key"])
    assert stored is not None
    assert stored.result is not None
    assert answer.content == orjson.loads(stored.result)  # the first attempt's stored result
    assert orjson.loads(stored.result)["refunded"] == 2599
    assert result.output == "Refunded."
    assert s.bodies == ["A-1001"]
    assert len(await effects(store)) == 1


async def test_concurrent_runs_of_one_turn_through_a_barrier(store: Store) -> None:
    s = await shop(store)
    runs = 6
    barrier = asyncio.Barrier(runs)

    async def together(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if returns(messages[-1:]):
            return ModelResponse(parts=[TextPart("Refunded.")])
        await barrier.wait()  # every run asks for the refund at the same moment
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1001", "cents": 2599})])

    agent = s.agent(together)
    results = await asyncio.gather(*(agent.run(PROMPT, deps=TURN) for _ in range(runs)))

    answers = [returns(r.all_messages())[-1] for r in results]
    assert len({str(a.content) for a in answers}) == 1
    assert sorted(a.metadata[METADATA_KEY]["replayed"] for a in answers) == [False] + [True] * (
        runs - 1
    )
    assert s.bodies == ["A-1001"]
    assert len(await effects(store)) == 1


async def test_in_progress_is_a_retry_prompt_and_the_retry_gets_the_stored_result(
    store: Store,
) -> None:
    s = await shop(store, wait=0.05)
    s.gate = asyncio.Event()
    first = asyncio.create_task(s.agent(refund_then_done("first")).run(PROMPT, deps=TURN))
    await asyncio.wait_for(s.started.wait(), 5)  # the first run's attempt holds the key

    async def retries_after_the_prompt(
        messages: list[ModelMessage], info: AgentInfo
    ) -> ModelResponse:
        last = returns(messages[-1:])
        if last and last[0].outcome == "retried":
            assert s.gate is not None
            s.gate.set()  # the first attempt finishes while the model thinks it over
            await first
        if last and last[0].outcome == "success":
            return ModelResponse(parts=[TextPart("Refunded.")])
        args = {"order": "A-1001", "cents": 2599, "reason": f"attempt {responses(messages)}"}
        return ModelResponse(parts=[ToolCallPart("refund", args)])

    try:
        # Bounded: were the retry keyed apart from the first attempt, it would wait on the gate.
        second = await asyncio.wait_for(
            s.agent(retries_after_the_prompt).run(PROMPT, deps=TURN), 10
        )
    finally:
        s.gate.set()
        await first

    retried, answered = returns(second.all_messages())
    assert retried.outcome == "retried"
    assert retried.retry is not None
    assert retried.retry.cause == "model_retry"
    assert "already being carried out" in str(retried.content)
    assert answered.metadata[METADATA_KEY]["ordinal"] == 1  # the retry kept its ordinal
    assert answered.metadata[METADATA_KEY]["replayed"] is True
    assert answered.content == returns((await first).all_messages())[0].content
    assert s.bodies == ["A-1001"]
    assert len(await effects(store)) == 1


async def test_a_failed_action_is_a_final_answer_and_the_corrected_call_a_new_action(
    store: Store,
) -> None:
    s = await shop(store)

    def over_the_limit_then_corrected(
        messages: list[ModelMessage], info: AgentInfo
    ) -> ModelResponse:
        step = responses(messages)
        if step < 2:
            cents = 50_000 if step == 0 else 2599
            return ModelResponse(
                parts=[ToolCallPart("refund", {"order": "A-1001", "cents": cents})]
            )
        return ModelResponse(parts=[TextPart("Refunded what the policy allows.")])

    agent = s.agent(over_the_limit_then_corrected)
    first = await agent.run(PROMPT, deps=TURN)
    failed, done = returns(first.all_messages())
    assert failed.outcome == "success"  # a tool result the model reads, not a retry prompt
    assert failed.content == {
        "error": "action_failed",
        "detail": "over the refund limit of 10000 cents",
    }
    assert failed.metadata[METADATA_KEY]["failed"] is True
    assert (failed.metadata[METADATA_KEY]["ordinal"], done.metadata[METADATA_KEY]["ordinal"]) == (
        1,
        2,
    )

    again = await agent.run(PROMPT, deps=TURN)  # the turn regenerated: both answers replayed
    assert [p.content for p in returns(again.all_messages())] == [failed.content, done.content]
    assert s.bodies == ["A-1001", "A-1001"]
    assert len(await effects(store)) == 1


async def test_needs_review_stops_the_run_and_is_never_shown_to_the_model(store: Store) -> None:
    s = await shop(store)
    seen: list[int] = []

    def ships(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(responses(messages))
        args = {"order": "opaque", "on": "2030-01-02", "value": "19.90"}
        return ModelResponse(parts=[ToolCallPart("ship", args)])

    for _ in range(2):  # the run, then a retry of the turn
        with pytest.raises(ActionNeedsReview, match=r"tenant-42%2Fconv-7:ship:3\.1:v1"):
            await s.agent(ships).run(PROMPT, deps=TURN)
    assert seen == [0, 0]  # the model never got a result or an error to act on
    assert s.bodies == ["opaque"]  # the external call was not made again
    assert await effects(store, "ship") == [("tenant-42%2Fconv-7:ship:3.1:v1", "2030-01-02 19.90")]


async def test_a_changed_call_at_the_same_place_is_a_conflict_not_a_second_effect(
    store: Store,
) -> None:
    s = await shop(store)
    await s.agent(refund_then_done("first", cents=2599)).run(PROMPT, deps=TURN)
    with pytest.raises(ActionConflict, match=r"call 1 of tool 'refund' in turn '3'"):
        await s.agent(refund_then_done("regenerated", cents=2600)).run(PROMPT, deps=TURN)
    assert s.bodies == ["A-1001"]
    assert len(await effects(store)) == 1


async def test_calls_rejected_before_running_take_no_ordinal(store: Store) -> None:
    s = await shop(store)

    def invalid_then_fixed(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = responses(messages)
        if step == 0:
            bad = ToolCallPart("refund", {"order": "A-1", "cents": "lots"})
            return ModelResponse(
                parts=[bad, ToolCallPart("refund", '{"order": "B-2", "cents": 100}')]
            )
        if step == 1:
            return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1", "cents": 200})])
        return ModelResponse(parts=[TextPart("Both refunded.")])

    result = await s.agent(invalid_then_fixed).run(PROMPT, deps=TURN)
    rejected, b, a = returns(result.all_messages())
    assert rejected.retry is not None
    assert rejected.retry.cause == "validation_error"
    assert (b.metadata[METADATA_KEY]["ordinal"], a.metadata[METADATA_KEY]["ordinal"]) == (1, 2)
    assert [n for _, n in await effects(store)] == ["A-1", "B-2"]


async def test_arguments_the_ledger_cannot_keep_are_a_retry_prompt(store: Store) -> None:
    """An integer past 64 bits fits the schema (an int) but no stored request: the model gets
    a retry prompt, nothing is claimed, and its corrected call takes the same ordinal."""
    s = await shop(store)

    def huge_then_fixed(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = responses(messages)
        if step < 2:
            cents = 2**70 if step == 0 else 100
            return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1", "cents": cents})])
        return ModelResponse(parts=[TextPart("Refunded.")])

    result = await s.agent(huge_then_fixed).run(PROMPT, deps=TURN)
    rejected, done = returns(result.all_messages())
    assert rejected.retry is not None
    assert "nothing was done" in str(rejected.content)
    assert done.metadata[METADATA_KEY]["ordinal"] == 1
    assert s.bodies == ["A-1"]
    assert [n for _, n in await effects(store)] == ["A-1"]


async def test_the_sweeper_runs_a_stale_transactional_call_from_its_stored_request(
    store: Store,
) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    s = await shop(store, lease=30.0)
    crash = True

    @s.tools.tool
    async def book(call: ToolCall, tx: Connection, order: str, on: dt.date) -> str:
        """Book a pickup (typed arguments: the stored request is validated again)."""
        assert isinstance(on, dt.date)
        if crash:
            raise SimulatedCrash  # the process dies inside the tool: the claim stays in flight
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            "book",
            call.action.key,
            call.fence,
            f"{order} {on.isoformat()}",
        )
        return f"booked {order} on {on.isoformat()}"

    def books(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if returns(messages[-1:]):
            return ModelResponse(parts=[TextPart("Booked.")])
        return ModelResponse(parts=[ToolCallPart("book", {"order": "A-1", "on": "2030-01-02"})])

    with pytest.raises(SimulatedCrash):
        await s.agent(books).run(PROMPT, deps=TURN)

    crash = False
    clock.advance(31.0)
    report = await s.actions.sweep()  # no agent run: the executor runs it from the ledger
    assert report.recovered == 1
    result = await s.agent(books).run(PROMPT, deps=TURN)
    (answer,) = returns(result.all_messages())
    assert answer.content == "booked A-1 on 2030-01-02"
    assert answer.metadata[METADATA_KEY]["replayed"] is True
    assert await effects(store, "book") == [("tenant-42%2Fconv-7:book:3.1:v1", "A-1 2030-01-02")]


@dataclasses.dataclass
class AppDeps:
    """An application's own deps: the Turn is one of its fields."""

    tenant: str
    conversation: str
    turn: Turn


async def test_the_turn_can_live_in_the_applications_own_deps(store: Store) -> None:
    s = await shop(store)
    by_attribute: ActionTools[AppDeps] = ActionTools(s.actions)
    by_function: ActionTools[AppDeps] = ActionTools(
        s.actions, turn=lambda deps: Turn(f"{deps.tenant}/{deps.conversation}", "t9")
    )

    async def note(call: ToolCall, tx: Connection, text: str) -> str:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            "note",
            call.action.key,
            call.fence,
            text,
        )
        return call.action.key

    by_attribute.add(note)
    by_function.add(note, name="note2")

    def notes(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if returns(messages[-1:]):
            return ModelResponse(parts=[TextPart("Noted.")])
        return ModelResponse(
            parts=[ToolCallPart("note", {"text": "a"}), ToolCallPart("note2", {"text": "b"})]
        )

    agent = Agent(
        FunctionModel(notes),
        deps_type=AppDeps,
        toolsets=[by_attribute.toolset, by_function.toolset],
    )
    result = await agent.run(PROMPT, deps=AppDeps("tenant-42", "conv-8", TURN))
    assert [p.content for p in returns(result.all_messages())] == [
        "tenant-42%2Fconv-7:note:3.1:v1",
        "tenant-42%2Fconv-8:note2:t9.1:v1",
    ]
    assert len(await effects(store, "note")) == 2


async def test_deps_without_a_turn_are_refused_before_the_store_is_touched(store: Store) -> None:
    s = await shop(store)
    agent = Agent(
        FunctionModel(refund_then_done("x")),
        deps_type=str,
        toolsets=[s.tools.toolset],  # type: ignore[list-item]  # the mistake under test
    )
    with pytest.raises(ConfigurationError, match="carry no receiver Turn"):
        await agent.run(PROMPT, deps="tenant-42")
    assert s.bodies == []
    async with store.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM receiver_receipts") == 0


def test_registration_and_turns_are_checked_up_front(tmp_path: Any) -> None:
    from receiver import SQLiteStore

    tools: ActionTools[Turn] = ActionTools(Actions(SQLiteStore(tmp_path / "r.db"), metrics=False))

    def sync(call: ToolCall, tx: Connection, order: str) -> None: ...
    async def no_tx(order: str) -> None: ...
    async def star(call: ToolCall, tx: Connection, *orders: str) -> None: ...
    async def fine(call: ToolCall, tx: Connection, order: str) -> None: ...

    with pytest.raises(ConfigurationError, match="must be an 'async def'"):
        tools.add(sync)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"must take \(call: ToolCall, tx: Connection\)"):
        tools.add(no_tx)
    with pytest.raises(ConfigurationError, match=r"\*args, \*\*kwargs"):
        tools.add(star)
    tools.add(fine)
    with pytest.raises(ConfigurationError, match="registered twice"):
        tools.add(fine)
    with pytest.raises(ConfigurationError, match="tool name"):
        tools.add(fine, name="has space")
    assert list(tools.toolset.tools) == ["fine"]
    for bad in (("", 1), ("t", ""), ("t", -1), ("t", True), ("t", 1.5)):
        with pytest.raises(ActionError, match=r"Turn\."):
            Turn(*bad)


async def test_the_worked_example_takes_each_action_once(store: Store) -> None:
    lines: list[str] = []
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    assert await pydantic_ai_example.demo(store, conversation, lines.append) == {
        "refunds": 2,
        "emails": 1,
    }
    answered = [line.split() for line in lines if line.lstrip().startswith("tool_call_id ")]
    ids = [words[1] for words in answered]
    keys = [words[3] for words in answered]
    assert len(set(ids)) == 5  # every answer of the model had new call ids ...
    assert keys[:2] == keys[2:4]  # ... and the regenerated turn had the same actions
    assert [words[-1] for words in answered] == ["False)", "False)", "True)", "True)", "True)"]


def test_the_worked_example_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.agents.pydantic_ai_example"],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("every action took effect once")
