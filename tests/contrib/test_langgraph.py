"""receiver.contrib.langgraph through LangGraph itself: its graphs, its SQLite checkpointer on a
real file, its interrupt() and retry policies, a graph process killed with SIGKILL; effects are
rows in PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import json
import operator
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

from examples.agents.langgraph_example import demo
from receiver import (
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    Actions,
    ConfigurationError,
    Connection,
    Store,
    ToolCall,
)
from receiver.contrib.langgraph import GraphActions, retry_on
from tests.contrib.langgraph_worker import (
    ORDER,
    Refund,
    effects,
    refund,
    register,
    settle_graph,
)

ROOT = Path(__file__).resolve().parents[2]
ToolCalls = Callable[[], list[tuple[str, dict[str, Any]]]]


async def executor(store: Store, **options: Any) -> Actions:
    """An executor with the ``refund`` tool, its ``effects`` table created."""
    await effects(store)
    actions = Actions(store, **options)
    register(actions)
    return actions


def thread(name: str = "th") -> Any:
    return {"configurable": {"thread_id": f"{name}-{uuid.uuid4().hex[:8]}"}}


@pytest.fixture
async def saver(tmp_path: Path) -> AsyncIterator[AsyncSqliteSaver]:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as opened:
        yield opened


class Calls:
    """Tools for the error mapping, each counting its invocations."""

    def __init__(self, actions: Actions) -> None:
        self.count: dict[str, int] = {"fail": 0, "opaque": 0, "flaky": 0}
        self.release = asyncio.Event()

        @actions.tool("fail")
        async def fail(call: ToolCall, tx: Connection) -> Any:
            self.count["fail"] += 1
            raise ActionFailed("a refund must be positive")

        @actions.tool("opaque", effects="external")
        async def opaque(call: ToolCall, tx: Connection) -> Any:
            self.count["opaque"] += 1
            return object()  # acted, and the answer cannot be stored: needs review

        @actions.tool("flaky")
        async def flaky(call: ToolCall, tx: Connection) -> Any:
            self.count["flaky"] += 1
            if self.count["flaky"] == 1:
                raise TimeoutError("the bank did not answer")
            return await refund(call, tx)

        @actions.tool("slow")
        async def slow(call: ToolCall, tx: Connection) -> Any:
            await self.release.wait()
            return await refund(call, tx)


def chat_graph(
    graph_actions: GraphActions,
    calls: ToolCalls,
    checkpointer: BaseCheckpointSaver[Any],
    *,
    tools: tuple[str, ...] = ("refund", "fail", "opaque", "flaky", "slow"),
    retry: RetryPolicy | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A model node that asks for ``calls()`` (fresh call ids each time), then the tool node."""

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {
            "messages": [
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": n, "args": a, "id": f"call_{uuid.uuid4().hex[:10]}"}
                        for n, a in calls()
                    ],
                )
            ]
        }

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", graph_actions.tool_node(tools), retry_policy=retry)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=checkpointer)


def ask(text: str = "refund A-1001") -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def replies(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


# -- the process dies after the effect, before the checkpoint ------------------------------------


async def test_killed_after_the_effect_the_resumed_graph_gets_the_stored_result(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    url = store_url
    checkpoints, signalled = tmp_path / "checkpoints.db", tmp_path / "refunded"
    command = [sys.executable, "-m", "tests.contrib.langgraph_worker", "--store", url]
    command += ["--checkpoints", str(checkpoints), "--thread", "conv-9"]
    worker = await asyncio.create_subprocess_exec(*command, "--hang", str(signalled), cwd=ROOT)
    try:
        for _ in range(1000):
            if (signalled.exists() and signalled.read_text()) or worker.returncode is not None:
                break
            await asyncio.sleep(0.02)
    finally:
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
    assert worker.returncode == -signal.SIGKILL
    before = json.loads(signalled.read_text())
    assert before["replayed"] is False
    assert await effects(store) == [before["key"]]
    # LangGraph never learned the node finished: its saved checkpoint still has it to run.
    async with AsyncSqliteSaver.from_conn_string(str(checkpoints)) as saver:
        graph = settle_graph(GraphActions(Actions(store)), saver)
        saved = await graph.aget_state({"configurable": {"thread_id": "conv-9"}})
    assert saved.next == ("settle",)
    assert not saved.values["results"]
    assert saved.tasks[0].result is None

    resumed = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await resumed.communicate()
    assert resumed.returncode == 0
    assert json.loads(out) == [{**before, "replayed": True}]
    assert await effects(store) == [before["key"]]


async def test_the_example_resends_a_turn_after_its_worker_died(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    url = store_url
    said: list[str] = []
    result = await demo(url, tmp_path / "checkpoints.db", said.append)
    first, again = result["first"], result["again"]
    tools = ["refund_order", "send_email"]
    assert [c["tool"] for c in first] == [c["tool"] for c in again] == tools
    # The model's call ids changed with its answer; the keys did not, and nothing ran twice.
    assert not {c["call_id"] for c in first} & {c["call_id"] for c in again}
    assert [c["action_key"] for c in first] == [c["action_key"] for c in again]
    assert [c["replayed"] for c in first] == [False, False]
    assert [c["replayed"] for c in again] == [True, True]
    assert [c["result"] for c in first] == [c["result"] for c in again]
    assert result["rows"] == {"refund_order": 1, "send_email": 1, "create_ticket": 1}
    assert result["final"].endswith(": closed")
    assert any("replayed: True" in line for line in said)


# -- interrupt() and concurrent invocations ------------------------------------------------------


async def test_interrupt_after_the_effect_resumes_to_the_stored_result(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store)
    graph_actions = GraphActions(actions)
    entered = []

    @graph_actions.node
    async def settle(state: Refund) -> dict[str, Any]:
        entered.append(state["order"])
        result = await graph_actions.run("refund", {"order": state["order"], "amount": 5})
        answer = interrupt({"refunded": result.value})  # LangGraph re-runs settle from its top
        return {"results": [{"replayed": result.replayed, "answer": answer, "key": result.key}]}

    builder = StateGraph(Refund)
    builder.add_node("settle", settle)
    builder.add_edge(START, "settle")
    graph = builder.compile(checkpointer=saver)
    config = thread()

    paused = await graph.ainvoke(ORDER.copy(), config)
    assert paused["__interrupt__"][0].value == {"refunded": {"refunded": 5, "order": "A-1001"}}
    assert len(await effects(store)) == 1
    done = await graph.ainvoke(Command(resume="approved"), config)
    assert entered == ["A-1001", "A-1001"]
    [result] = done["results"]
    assert result["replayed"] is True
    assert result["answer"] == "approved"
    assert await effects(store) == [result["key"]]


async def test_two_invocations_of_one_thread_take_effect_once(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store)
    graph_actions = GraphActions(actions)
    barrier = asyncio.Barrier(2)

    @graph_actions.node
    async def settle(state: Refund) -> dict[str, Any]:
        await barrier.wait()  # both invocations are inside the step before either calls
        result = await graph_actions.run("refund", {"order": state["order"], "amount": 7})
        return {"results": [{"value": result.value, "replayed": result.replayed}]}

    builder = StateGraph(Refund)
    builder.add_node("settle", settle)
    builder.add_edge(START, "settle")
    graph = builder.compile(checkpointer=saver)
    config = thread()

    a, b = await asyncio.gather(*(graph.ainvoke(ORDER.copy(), config) for _ in range(2)))
    assert sorted(x["results"][0]["replayed"] for x in (a, b)) == [False, True]
    assert a["results"][0]["value"] == b["results"][0]["value"]
    assert len(await effects(store)) == 1


async def test_two_answers_to_one_interrupt_take_effect_once(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    """A person approves twice at once: each resume checkpoints the approval on its own (two
    checkpoint ids, so two LangGraph task ids for the next step); the step is the same."""
    actions = await executor(store)
    graph_actions = GraphActions(actions)
    barrier = asyncio.Barrier(2)

    async def approve(state: Refund) -> dict[str, Any]:
        interrupt("refund A-1001?")
        return {}

    @graph_actions.node
    async def settle(state: Refund) -> dict[str, Any]:
        await barrier.wait()
        result = await graph_actions.run("refund", {"order": state["order"], "amount": 9})
        return {"results": [{"replayed": result.replayed}]}

    builder = StateGraph(Refund)
    builder.add_node("approve", approve)
    builder.add_node("settle", settle)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", "settle")
    graph = builder.compile(checkpointer=saver)
    config = thread()
    await graph.ainvoke(ORDER.copy(), config)

    a, b = await asyncio.gather(
        graph.ainvoke(Command(resume=True), config), graph.ainvoke(Command(resume=True), config)
    )
    assert sorted(x["results"][0]["replayed"] for x in (a, b)) == [False, True]
    assert len(await effects(store)) == 1


# -- what the graph sees -------------------------------------------------------------------------


async def test_a_final_failure_and_an_unknown_tool_are_messages_to_the_model(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store)
    tools = Calls(actions)
    graph_actions = GraphActions(actions)
    calls: ToolCalls = lambda: [  # noqa: E731
        ("refund", {"order": "A-1", "amount": 3}),
        ("fail", {"order": "A-1", "amount": -3}),
        ("wire_money", {"to": "someone"}),
    ]
    config = thread()
    done = await chat_graph(graph_actions, calls, saver).ainvoke(ask(), config)
    refunded, failed, unknown = replies(done)
    assert refunded.status == "success"
    assert json.loads(str(refunded.content)) == {"refunded": 3, "order": "A-1"}
    assert failed.status == "error"
    assert json.loads(str(failed.content)) == {
        "error": "action_failed",
        "detail": "a refund must be positive",
    }
    assert unknown.status == "error"
    assert json.loads(str(unknown.content))["error"] == "unknown_tool"
    assert [m.tool_call_id for m in (refunded, failed, unknown)] == [
        c["id"] for c in done["messages"][1].tool_calls
    ]

    # The same step again, nothing of it saved: the stored answers, the failing tool not rerun.
    again = await chat_graph(graph_actions, calls, InMemorySaver()).ainvoke(ask(), config)
    assert [m.content for m in replies(again)] == [m.content for m in (refunded, failed, unknown)]
    assert tools.count["fail"] == 1
    assert len(await effects(store)) == 1


async def test_arguments_the_ledger_cannot_keep_are_a_message_to_the_model(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    """NaN (which a model's JSON can spell: json.loads reads it): an error message the model can
    correct, nothing claimed, and the other calls of the message still run (it stopped the
    graph). An integer past 64 bits never gets here: the checkpointer cannot save it."""
    actions = await executor(store)
    Calls(actions)
    calls: ToolCalls = lambda: [  # noqa: E731
        ("refund", {"order": "A-1", "amount": float("nan")}),
        ("refund", {"order": "A-2", "amount": 3}),
    ]
    done = await chat_graph(GraphActions(actions), calls, saver).ainvoke(ask(), thread())
    invalid, refunded = replies(done)
    assert invalid.status == "error"
    assert json.loads(str(invalid.content))["error"] == "invalid_arguments"
    assert "at amount" in json.loads(str(invalid.content))["detail"]  # where, for the model
    assert refunded.status == "success"
    assert len(await effects(store)) == 1


async def test_needs_review_stops_the_graph_every_time(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store)
    tools = Calls(actions)
    graph_actions = GraphActions(actions)
    calls: ToolCalls = lambda: [  # noqa: E731
        ("refund", {"order": "A-2", "amount": 4}),
        ("opaque", {"order": "A-2"}),
    ]
    graph = chat_graph(graph_actions, calls, saver)
    config = thread()
    with pytest.raises(ActionNeedsReview):
        await graph.ainvoke(ask(), config)
    state = await graph.aget_state(config)
    assert state.next == ("tools",)
    assert not replies(state.values)  # nothing shown to the model
    with pytest.raises(ActionNeedsReview):
        await graph.ainvoke(None, config)  # the resume: the stored verdict, not another call
    assert tools.count["opaque"] == 1
    assert len(await effects(store)) == 1


async def test_a_conflicting_rerun_of_a_step_stops_the_graph(store: Store) -> None:
    """The turn is sent again after a crash that saved nothing, and the model now asks for
    another amount under the same step: refused, the first refund stands alone."""
    actions = await executor(store)
    Calls(actions)
    graph_actions = GraphActions(actions)
    config = thread()
    amounts = iter([2599, 100])
    calls: ToolCalls = lambda: [("refund", {"order": "A-3", "amount": next(amounts)})]  # noqa: E731
    await chat_graph(graph_actions, calls, InMemorySaver()).ainvoke(ask(), config)
    with pytest.raises(ActionConflict):
        await chat_graph(graph_actions, calls, InMemorySaver()).ainvoke(ask(), config)
    assert len(await effects(store)) == 1


async def test_in_progress_stops_the_graph_or_is_retried_by_a_policy(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store, wait=0.0)  # a twin is told at once that the first still runs
    tools = Calls(actions)
    graph_actions = GraphActions(actions)
    calls: ToolCalls = lambda: [("slow", {"order": "A-4", "amount": 8})]  # noqa: E731

    refusals: list[Exception] = []

    def counted(exc: Exception) -> bool:
        refusals.append(exc)
        return retry_on(exc)

    async def twins(retry: RetryPolicy | None) -> tuple[Any, Any]:
        refusals.clear()
        config = thread()
        graph = chat_graph(graph_actions, calls, saver, retry=retry)
        # Both read the same thread; one claims the step's action and waits on the slow tool,
        # the other is refused (and, under the policy, retried) until it is released.
        runs = [asyncio.create_task(graph.ainvoke(ask(), config)) for _ in range(2)]
        for _ in range(500):
            if refusals or any(r.done() for r in runs):
                break
            await asyncio.sleep(0.02)
        tools.release.set()
        try:
            first, second = await asyncio.gather(*runs, return_exceptions=True)
        finally:
            tools.release.clear()
        return (first, second) if isinstance(second, BaseException) else (second, first)

    done, refused = await twins(None)
    assert isinstance(refused, ActionInProgress)
    assert replies(done)[0].artifact["replayed"] is False

    policy = RetryPolicy(retry_on=counted, initial_interval=0.05, jitter=False, max_attempts=50)
    a, b = await twins(policy)
    assert refusals  # the policy saw the refusal and ran the node again
    assert all(isinstance(e, ActionInProgress) for e in refusals)
    assert sorted(replies(x)[0].artifact["replayed"] for x in (a, b)) == [False, True]
    assert replies(a)[0].content == replies(b)[0].content
    assert len(await effects(store)) == 2  # one per thread


async def test_a_tools_own_error_stops_the_graph_and_its_resume_runs_it_again(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store)
    tools = Calls(actions)
    graph = chat_graph(
        GraphActions(actions), lambda: [("flaky", {"order": "A-5", "amount": 6})], saver
    )
    config = thread()
    with pytest.raises(TimeoutError):
        await graph.ainvoke(ask(), config)
    done = await graph.ainvoke(None, config)  # the claim was released: it runs again
    assert replies(done)[0].artifact["replayed"] is False
    assert tools.count["flaky"] == 2
    assert len(await effects(store)) == 1


def test_retry_on_retries_only_what_a_retry_can_change() -> None:
    assert retry_on(ActionInProgress("busy"))
    assert not retry_on(ActionFailed("no"))
    assert not retry_on(ActionNeedsReview("look"))
    assert not retry_on(ActionConflict("other"))
    assert retry_on(ConnectionError("reset"))  # LangGraph's own default still applies
    assert not retry_on(ValueError("bug"))


# -- the key -------------------------------------------------------------------------------------


async def test_keys_are_the_tenant_thread_step_and_ordinal(
    store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(store)
    Calls(actions)
    graph_actions = GraphActions(actions, tenant=lambda runtime: runtime.context["tenant"])
    calls: ToolCalls = lambda: [  # noqa: E731
        ("refund", {"order": "B-1", "amount": 1}),
        ("refund", {"order": "B-2", "amount": 2}),
    ]
    graph = chat_graph(graph_actions, calls, saver)
    config = thread("conv")
    name = config["configurable"]["thread_id"]
    done = await graph.ainvoke(ask(), config, context={"tenant": "acme"})
    keys = [m.artifact["action_key"] for m in replies(done)]
    assert keys == [f"acme%2F{name}:refund:2.tools.{n}:v1" for n in (1, 2)]
    # Another tenant, another thread: other actions. Each refund of each took effect once.
    await graph.ainvoke(ask(), config, context={"tenant": "globex"})
    await graph.ainvoke(ask(), thread("conv"), context={"tenant": "acme"})
    assert len(set(await effects(store))) == len(await effects(store)) == 6


async def test_sends_and_tasks_are_numbered_by_their_place_in_the_step(store: Store) -> None:
    actions = await executor(store)
    graph_actions = GraphActions(actions)

    class Orders(TypedDict, total=False):
        orders: list[str]
        results: Annotated[list[Any], operator.add]

    @graph_actions.node
    async def refund_one(state: Refund) -> dict[str, Any]:
        result = await graph_actions.run("refund", {"order": state["order"], "amount": 1})
        return {"results": [result.key]}

    builder = StateGraph(Orders)
    builder.add_node("refund_one", refund_one)
    builder.add_conditional_edges(
        START, lambda s: [Send("refund_one", {"order": o}) for o in s["orders"]], ["refund_one"]
    )
    builder.add_edge("refund_one", END)

    @task
    @graph_actions.node
    async def refund_task(order: str) -> str:
        return (await graph_actions.run("refund", {"order": order, "amount": 2})).key

    def flow(checkpointer: BaseCheckpointSaver[Any]) -> Any:
        @entrypoint(checkpointer=checkpointer)
        async def refund_all(orders: list[str]) -> list[str]:
            return [await refund_task(o) for o in orders]

        return refund_all

    config, functional = thread(), thread()
    # Run twice on checkpointers that saved nothing between (a crash under durability="exit").
    for _ in range(2):
        sent = await builder.compile(checkpointer=InMemorySaver()).ainvoke(
            {"orders": ["S-1", "S-2"]}, config
        )
        called = await flow(InMemorySaver()).ainvoke(["T-1", "T-2"], functional)
    assert len(set(sent["results"])) == len(set(called)) == 2
    assert sorted(await effects(store)) == sorted([*sent["results"], *called])


async def test_misuse_is_refused_before_the_store_is_touched(
    sqlite_store: Store, saver: AsyncSqliteSaver
) -> None:
    actions = await executor(sqlite_store)
    graph_actions = GraphActions(actions)
    with pytest.raises(ActionError, match="decorated"):
        await graph_actions.run("refund", {"order": "X", "amount": 1})
    with pytest.raises(ConfigurationError, match="registered"):
        graph_actions.tool_node(["refund", "nope"])
    with pytest.raises(ConfigurationError, match="async def"):
        graph_actions.node(lambda state: state)
    with pytest.raises(ConfigurationError, match="tenant"):
        GraphActions(actions, tenant="  ")

    @graph_actions.node
    async def settle(state: Refund) -> dict[str, Any]:
        await graph_actions.run("refund", {"order": state["order"], "amount": 1})
        return {}

    builder = StateGraph(Refund)
    builder.add_node("settle", settle)
    builder.add_edge(START, "settle")
    with pytest.raises(ActionError, match="thread"):  # no checkpointer: nothing to resume
        await builder.compile().ainvoke(ORDER.copy())

    @task
    async def undecorated(order: str) -> Any:
        return await graph_actions.run("refund", {"order": order, "amount": 1})

    @entrypoint(checkpointer=saver)
    @graph_actions.node
    async def outer(order: str) -> Any:
        return await undecorated(order)

    with pytest.raises(ActionError, match="decorated"):
        await outer.ainvoke("X", thread())
    assert await effects(sqlite_store) == []
