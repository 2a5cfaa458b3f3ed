"""The OpenAI Agents SDK row of the agents benchmark: a tool called directly against the same
tool through the executor (``python -m benchmarks.agents_openai``).

One trivial tool (it echoes an order id), built twice: with the SDK's own ``function_tool``
(direct) and with :func:`receiver.contrib.openai_agents.action_tool` (through the executor).
Two levels, each sequential, microseconds per call:

- **tool**: ``on_invoke_tool`` alone, as the SDK's run loop calls it;
- **turn**: a whole ``Runner.run`` of one turn with one tool call (a scripted model: request,
  tool call, request, answer), what an application sees.

Sides: ``direct``; ``fresh`` (every call a new turn: claim, run, store); ``replay`` (a turn
already done, answered from this process's replay cache); ``ledger`` (the same, through an
executor without a cache, as another process sees it: one claim statement). Ratio = side /
direct, same run. PostgreSQL (database ``receiver_bench_agents_openai``, dropped and created
again) and a SQLite file. Figures only: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    RunConfig,
    Runner,
    Usage,
    function_tool,
)
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseStreamEvent,
)

from receiver import Actions, Connection, PostgresStore, SQLiteStore, Store, ToolCall
from receiver.contrib.openai_agents import TURN_KEY, AgentTurn, action_tool

from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_agents_openai"
ARGUMENTS = json.dumps({"order_id": "o-1"})
QUIET = RunConfig(tracing_disabled=True)
SIDES = ("fresh", "replay", "ledger")


async def echo(order_id: str) -> dict[str, Any]:
    """Echo an order id."""
    return {"order": order_id, "ok": True}


def through(actions: Actions) -> FunctionTool:
    async def echo(call: ToolCall, tx: Connection, order_id: str) -> dict[str, Any]:
        """Echo an order id."""
        return {"order": order_id, "ok": True}

    return action_tool(actions)(echo)


class OneCall(Model):
    """Asks for the tool once, then answers: the same two responses for every turn."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        given = args[1] if len(args) > 1 else kwargs["input"]
        answered = not isinstance(given, str) and given[-1].get("type") == "function_call_output"
        if answered:
            content: list[ResponseOutputText | ResponseOutputRefusal] = [
                ResponseOutputText(type="output_text", text="done", annotations=[])
            ]
            out: Any = ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed", content=content
            )
        else:
            out = ResponseFunctionToolCall(
                type="function_call", call_id="call_1", name="echo", arguments=ARGUMENTS
            )
        return ModelResponse(output=[out], usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[ResponseStreamEvent]:
        raise NotImplementedError


def context(turn: str) -> dict[str, Any]:
    return {TURN_KEY: AgentTurn.start(tenant="bench", conversation="c", turn=turn)}


async def timed(seconds: float, one: Callable[[int], Awaitable[Any]]) -> tuple[float, int]:
    """Microseconds per call of ``one(n)``, sequentially for ``seconds``; and how many."""
    n = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        await one(n)
        n += 1
    return (time.perf_counter() - started) / n * 1e6, n


async def tool_level(store: Store, seconds: float, run: str) -> dict[str, float]:
    direct_tool = function_tool(echo)
    cached = through(Actions(store, metrics=False, sweep_interval=None))
    uncached = through(Actions(store, metrics=False, sweep_interval=None, replay_cache=0))

    def invoke(tool: FunctionTool, turn: str) -> Awaitable[Any]:
        ctx = ToolContext(
            context(turn), tool_name="echo", tool_call_id="call_1", tool_arguments=ARGUMENTS
        )
        return tool.on_invoke_tool(ctx, ARGUMENTS)

    figures = {"direct": (await timed(seconds, lambda n: invoke(direct_tool, "d")))[0]}
    figures["fresh"], made = await timed(seconds, lambda n: invoke(cached, f"{run}-t{n}"))
    figures["replay"] = (await timed(seconds, lambda n: invoke(cached, f"{run}-t{n % made}")))[0]
    figures["ledger"] = (await timed(seconds, lambda n: invoke(uncached, f"{run}-t{n % made}")))[0]
    return figures


async def turn_level(store: Store, seconds: float, run: str) -> dict[str, float]:
    model = OneCall()
    direct = Agent(name="bench", model=model, tools=[function_tool(echo)])
    cached = Agent(
        name="bench",
        model=model,
        tools=[through(Actions(store, metrics=False, sweep_interval=None))],
    )
    uncached = Agent(
        name="bench",
        model=model,
        tools=[through(Actions(store, metrics=False, sweep_interval=None, replay_cache=0))],
    )

    def turn(agent: Agent[Any], name: str) -> Awaitable[Any]:
        return Runner.run(agent, "go", context=context(name), run_config=QUIET)

    figures = {"direct": (await timed(seconds, lambda n: turn(direct, "d")))[0]}
    figures["fresh"], made = await timed(seconds, lambda n: turn(cached, f"{run}-r{n}"))
    figures["replay"] = (await timed(seconds, lambda n: turn(cached, f"{run}-r{n % made}")))[0]
    figures["ledger"] = (await timed(seconds, lambda n: turn(uncached, f"{run}-r{n % made}")))[0]
    return figures


async def _one_store(store: Store, seconds: float) -> dict[str, dict[str, float]]:
    async with store:
        await store.migrate()
        run = f"{time.time_ns()}"
        return {
            "tool": await tool_level(store, seconds, run),
            "turn": await turn_level(store, seconds, run),
        }


async def measure(seconds: float, pg_url: str = DEFAULT_PG) -> dict[str, Any]:
    """Every figure (microseconds per call), per store and level."""
    await fresh_pg(pg_url)
    out = {"postgresql": await _one_store(PostgresStore(pg_url, max_size=4), seconds)}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = await _one_store(SQLiteStore(Path(tmp) / "agents.db"), seconds)
    return out


def describe(result: dict[str, Any]) -> str:
    lines = [
        "OpenAI Agents SDK (sequential; us per call, ratio = side / direct):",
        f"  {'store':<11} {'level':<5} {'direct':>8}"
        + "".join(f" {side:>8} {'ratio':>6}" for side in SIDES),
    ]
    for store, levels in result.items():
        for level, f in levels.items():
            lines.append(
                f"  {store:<11} {level:<5} {f['direct']:>8.1f}"
                + "".join(f" {f[s]:>8.1f} {f[s] / f['direct']:>6.2f}" for s in SIDES)
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agents_openai")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measured side")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="database to drop and recreate")
    args = parser.parse_args()
    print(describe(asyncio.run(measure(args.seconds, args.pg_url))))


if __name__ == "__main__":
    main()
