"""A LangGraph support agent whose tools take effect once, however often LangGraph runs them.

    python -m examples.agents.langgraph_example                    # SQLite files in a temp dir
    python -m examples.agents.langgraph_example --store postgresql://localhost/app

The graph is the usual loop (a chat model node, a tools node, back to the model) plus a
``follow_up`` node that opens a ticket and then asks a person, with ``interrupt()``, whether to
close the conversation. It runs on LangGraph's own SQLite checkpointer, with a scripted model (no
network, no API key) that words its prose anew and gets new tool-call ids on every generation,
as a real one does. The run shows:

1. a worker process runs the turn with ``durability="exit"`` (LangGraph saves the thread when
   the run ends) and dies (``os._exit``) after the tools ran: the refund and the email happened,
   and no checkpoint says so;
2. the message is sent again: the model is asked again and answers with other ``tool_call``
   ids and other wording, and every call gets its stored result. The key is the thread, the
   step, the node and the call's ordinal in it: the same in this run as in the dead one, where
   the model's call ids (changed) and LangGraph's task ids (a hash over checkpoint ids the dead
   run never saved) are not;
3. ``follow_up`` opens the ticket and waits for the person; the answer resumes it, LangGraph
   runs it again from its top, and the ticket it opened before the interrupt is not opened twice.

Each tool's rows are counted at the end: one each.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from receiver import Actions, Store, store_from_url
from receiver.contrib.langgraph import GraphActions, retry_on

from .tools import Bank, create_tables, register

TENANT = "tenant-42"
TOOLS = ("refund_order", "send_email")
MESSAGE = "My order A-1001 arrived broken."
ROOT = Path(__file__).resolve().parents[2]
PROSE = (
    "The parcel arrived damaged; refunding per policy.",
    "Sorry about that! Taking care of the refund now.",
    "As requested, refunding the broken order.",
)


class ScriptedModel:
    """Stands in for a chat model: asks for the refund and the email, then sums up. Every
    generation has fresh call ids and new prose, as a regenerated answer does."""

    def __init__(self, seed: int = 0) -> None:
        self.prose = itertools.cycle(PROSE[seed % len(PROSE) :] + PROSE[: seed % len(PROSE)])

    def __call__(self, messages: list[AnyMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return AIMessage(content="Refunded A-1001 and emailed Ada.")
        prose = next(self.prose)
        calls = [
            ("refund_order", {"order_id": "A-1001", "amount_cents": 2599, "reason": prose}),
            ("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": prose}),
        ]
        return AIMessage(
            content="",
            tool_calls=[
                {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}"}
                for name, args in calls
            ],
        )


def build(
    graph_actions: GraphActions,
    model: ScriptedModel,
    checkpointer: AsyncSqliteSaver,
    *,
    die_after_tools: bool = False,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    async def agent(state: MessagesState) -> dict[str, Any]:
        if die_after_tools and isinstance(state["messages"][-1], ToolMessage):
            # Act 1's worker: the tools ran, nothing is checkpointed yet. Say what ran, die.
            print(json.dumps(summary(state["messages"])), flush=True)
            os._exit(1)
        return {"messages": [model(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "follow_up"

    @graph_actions.node
    async def follow_up(state: MessagesState) -> dict[str, Any]:
        # Runs again from here when the person answers: the ticket is the stored one.
        ticket = await graph_actions.run(
            "create_ticket", {"subject": "Courier complaint A-1001", "details": "damaged"}
        )
        answer = interrupt({"question": "Close the conversation?", "ticket": ticket.value})
        return {"messages": [AIMessage(content=f"Ticket {ticket.value['ticket']}: {answer}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    # retry_on: a second attempt still running this step's tools is waited for, not failed.
    builder.add_node(
        "tools", graph_actions.tool_node(TOOLS), retry_policy=RetryPolicy(retry_on=retry_on)
    )
    builder.add_node("follow_up", follow_up)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", "follow_up"])
    builder.add_edge("tools", "agent")
    builder.add_edge("follow_up", END)
    return builder.compile(checkpointer=checkpointer)


def executor(store: Store) -> GraphActions:
    actions = Actions(store, lease=30.0, wait=10.0)
    register(actions, Bank())
    return GraphActions(actions, tenant=TENANT)


def summary(messages: list[AnyMessage]) -> list[dict[str, Any]]:
    """Each tool reply: the tool, the model's call id, the action key, whether replayed."""
    return [
        {
            "tool": m.name,
            "call_id": m.tool_call_id,
            "result": json.loads(str(m.content)),
            **m.artifact,
        }
        for m in messages
        if isinstance(m, ToolMessage)
    ]


def config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


async def worker(url: str, checkpoints: Path, thread: str) -> None:
    """Act 1, in its own process: run the turn and die after the tools."""
    async with (
        store_from_url(url) as store,
        AsyncSqliteSaver.from_conn_string(str(checkpoints)) as saver,
    ):
        graph = build(executor(store), ScriptedModel(0), saver, die_after_tools=True)
        await graph.ainvoke(
            {"messages": [HumanMessage(MESSAGE)]}, config(thread), durability="exit"
        )


async def demo(url: str, checkpoints: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The three acts, on a new thread; what happened, for the tests."""
    thread = f"conv-{uuid.uuid4().hex[:8]}"
    async with store_from_url(url) as store:
        await create_tables(store)
    say("1. a worker runs the turn and dies after the tools, before any checkpoint")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.agents.langgraph_example",
        "--store",
        url,
        "--worker",
        str(checkpoints),
        thread,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    first = json.loads(out.decode().strip().splitlines()[-1])
    for call in first:
        say(f"   {call['tool']:<13} call id {call['call_id']} -> {call['action_key']}")
    say(f"   worker exit status {child.returncode}")

    async with (
        store_from_url(url) as store,
        AsyncSqliteSaver.from_conn_string(str(checkpoints)) as saver,
    ):
        graph = build(executor(store), ScriptedModel(1), saver)
        saved = await graph.aget_state(config(thread))
        say(f"2. nothing saved for the thread ({len(saved.values)} values): the message again")
        await graph.ainvoke({"messages": [HumanMessage(MESSAGE)]}, config(thread))
        state = await graph.aget_state(config(thread))
        again = summary(state.values["messages"])
        for call in again:
            say(
                f"   {call['tool']:<13} call id {call['call_id']} -> {call['action_key']} "
                f"(replayed: {call['replayed']})"
            )
        say(f"3. waiting for a person: {state.interrupts[0].value}; the answer resumes it")
        done = await graph.ainvoke(Command(resume="closed"), config(thread))
        final = str(done["messages"][-1].content)
        say(f"   {final}")
        written = await rows(store, thread, [*first, *again])
    say(f"rows per tool: {json.dumps(written)}")
    return {"first": first, "again": again, "final": final, "rows": written}


async def rows(store: Store, thread: str, results: list[dict[str, Any]]) -> dict[str, int]:
    """The rows each tool wrote for this thread: refunds and tickets carry their action key
    (which holds the thread); the outbox, the message ids (downstream keys) of every result
    seen, in both runs (one key per email action: one row)."""
    like = f"%{thread}%"
    sent = {r["result"]["message_id"] for r in results if r["tool"] == "send_email"}
    async with store.acquire() as conn:
        counts = {
            "refund_order": await conn.fetchval(
                "SELECT count(*) FROM example_refunds WHERE action_key LIKE $1", like
            ),
            "send_email": sum(
                [
                    await conn.fetchval(
                        "SELECT count(*) FROM example_outbox WHERE downstream_key = $1", key
                    )
                    for key in sent
                ]
            ),
            "create_ticket": await conn.fetchval(
                "SELECT count(*) FROM example_tickets WHERE action_key LIKE $1", like
            ),
        }
    return {tool: int(n) for tool, n in counts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.agents.langgraph_example")
    parser.add_argument("--store", help="postgresql://... or sqlite:///path (default: temp)")
    parser.add_argument("--worker", nargs=2, metavar=("CHECKPOINTS", "THREAD"), help="act 1")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.store, Path(args.worker[0]), args.worker[1]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{Path(tmp) / 'receipts.db'}"
        result = asyncio.run(demo(url, Path(tmp) / "checkpoints.db"))
    if any(n != 1 for n in result["rows"].values()):
        print(f"UNEXPECTED: {result['rows']}", file=sys.stderr)
        return 1
    print("every action took effect once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
