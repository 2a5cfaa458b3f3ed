"""What a keyed LangGraph tool costs: the same tool called directly and through the executor
(``python -m benchmarks.agents_langgraph``).

One trivial tool (it echoes its order id), run by a one-node LangGraph graph per side, each
invocation handed an AI message with one call of it. Sides, measured in alternating rounds
(``--rounds``, ``--seconds`` per side and round), ``--concurrency`` invocations at a time:

- ``direct``: a hand-written tool node calling the tool's function (what a graph does today);
- ``toolnode``: LangGraph's prebuilt ``ToolNode`` with the tool as a LangChain tool (reference);
- ``fresh``: :meth:`receiver.contrib.langgraph.GraphActions.tool_node`, a new thread per
  invocation (claim, run, store);
- ``replay``: threads run before, the same step again: answered from the executor's cache;
- ``ledger``: the same threads through an executor without a cache, as another process sees
  them (one claim statement answers with the stored result).

The graphs have no checkpointer (the thread id still keys the actions), so LangGraph's own cost
is the same on every side and the difference is the executor's. Invocations per second per
side, ratio = side / direct, same run, and the CPU time this process spent per invocation
(steadier than rates on a shared machine; the database's time is not in it). PostgreSQL
(database ``receiver_bench_langgraph``, dropped and created again) and a SQLite file. Figures
only: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool as langchain_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode

from receiver import Actions, Connection, PostgresStore, SQLiteStore, Store, ToolCall
from receiver.contrib.langgraph import GraphActions

from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_langgraph"
SIDES = ("direct", "toolnode", "fresh", "replay", "ledger")


async def echo_order(order: str) -> dict[str, Any]:
    return {"order": order, "ok": True}


async def echo(call: ToolCall, tx: Connection) -> Any:
    return await echo_order(call.request["order"])


@langchain_tool
async def echo_tool(order: str) -> str:
    """Echo the order id."""
    return json.dumps(await echo_order(order))


async def direct_node(state: MessagesState) -> dict[str, Any]:
    message = state["messages"][-1]
    assert isinstance(message, AIMessage)
    return {
        "messages": [
            ToolMessage(
                content=json.dumps(await echo_order(**call["args"])),
                tool_call_id=call["id"] or "",
                name=call["name"],
            )
            for call in message.tool_calls
        ]
    }


def one_node(node: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile()


def keyed(store: Store, replay_cache: int) -> CompiledStateGraph[Any, Any, Any, Any]:
    actions = Actions(store, metrics=False, replay_cache=replay_cache, sweep_interval=None)
    actions.add_tool("echo_tool", echo)
    return one_node(GraphActions(actions).tool_node(["echo_tool"]))


def request(n: int) -> dict[str, Any]:
    call = {"name": "echo_tool", "args": {"order": f"o-{n}"}, "id": f"call_{n}"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


async def _rate(
    seconds: float, concurrency: int, one: Callable[[int], Awaitable[Any]]
) -> tuple[float, int, float]:
    """Invocations per second of ``concurrency`` tasks calling ``one(n)`` for ``seconds``,
    how many, and the CPU seconds this process spent on them (not the database's)."""
    counter = itertools.count()
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await one(next(counter))
            done += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started), done, time.process_time() - cpu


async def measure_store(
    store: Store, seconds: float, rounds: int, concurrency: int
) -> dict[str, float]:
    graphs = {
        "direct": one_node(direct_node),
        "toolnode": one_node(ToolNode([echo_tool])),
        "fresh": keyed(store, 10_000),
        "ledger": keyed(store, 0),
    }
    graphs["replay"] = graphs["fresh"]
    run, fresh_ids = uuid.uuid4().hex[:8], itertools.count()
    used: list[str] = []

    def invoke(side: str) -> Callable[[int], Awaitable[Any]]:
        async def one(n: int) -> Any:
            if side in ("replay", "ledger"):
                thread = used[n % len(used)]
            else:
                thread = f"{run}-{next(fresh_ids)}"
                if side == "fresh":
                    used.append(thread)
            config: Any = {"configurable": {"thread_id": thread}}
            out = await graphs[side].ainvoke(request(0), config)
            if side in ("replay", "ledger") and not out["messages"][-1].artifact["replayed"]:
                raise RuntimeError(f"{side}: a fresh execution where a replay was expected")
            return out

        return one

    await _rate(0.3, concurrency, invoke("fresh"))  # warm up; seeds the threads to replay
    totals = {side: [0.0, 0, 0.0] for side in SIDES}
    for _ in range(rounds):
        for side in SIDES:
            rate, count, cpu = await _rate(seconds, concurrency, invoke(side))
            totals[side][0] += count / rate
            totals[side][1] += count
            totals[side][2] += cpu
    rates = {side: n / t for side, (t, n, _) in totals.items()}
    out: dict[str, float] = {f"{side}_per_s": round(rate) for side, rate in rates.items()}
    for side, (_, n, cpu) in totals.items():
        out[f"{side}_cpu_us"] = round(cpu / n * 1e6, 1)
    for side in SIDES[1:]:
        out[f"{side}_ratio"] = round(rates[side] / rates["direct"], 3)
    return out


async def measure(
    seconds: float, rounds: int, concurrency: int, pg_url: str = DEFAULT_PG
) -> dict[str, Any]:
    await fresh_pg(pg_url)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, store in (
            ("postgresql", PostgresStore(pg_url, max_size=10)),
            ("sqlite", SQLiteStore(Path(tmp) / "langgraph.db")),
        ):
            async with store:
                await store.migrate()
                out[name] = await measure_store(store, seconds, rounds, concurrency)
    return out


def describe(result: dict[str, Any], concurrency: int) -> str:
    lines = [
        f"langgraph (one tool call per graph invocation, {concurrency} at a time, no "
        "checkpointer; ratio = side / direct):",
        f"  {'store':<11} {'direct':>7} "
        + " ".join(f"{side:>9} {'ratio':>6}" for side in SIDES[1:])
        + "   (invocations/s)",
    ]
    for store, f in result.items():
        lines.append(
            f"  {store:<11} {f['direct_per_s']:>7} "
            + " ".join(f"{f[f'{s}_per_s']:>9} {f[f'{s}_ratio']:>6.3f}" for s in SIDES[1:])
        )
    lines.append("  CPU of this process per invocation (us, the database's not included):")
    for store, f in result.items():
        lines.append(f"  {store:<11} " + " ".join(f"{s} {f[f'{s}_cpu_us']}" for s in SIDES))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agents_langgraph")
    parser.add_argument("--seconds", type=float, default=1.0, help="per side and round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per side")
    parser.add_argument("--concurrency", type=int, default=1, help="invocations at a time")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="database to drop and recreate")
    args = parser.parse_args()
    result = asyncio.run(measure(args.seconds, args.rounds, args.concurrency, args.pg_url))
    print(describe(result, args.concurrency))


if __name__ == "__main__":
    main()
