"""What exactly-once costs a Pydantic AI tool (``python -m benchmarks.agents_pydantic_ai``).

One agent run = one user prompt, one tool call (one business row written), one text answer,
driven by Pydantic AI's own run loop with a ``FunctionModel`` (no network: the model's latency,
which dwarfs all of this in production, is left out on purpose). Sides, each run sequentially
for ``--seconds``:

- ``direct``: the same tool as a plain Pydantic AI tool writing its row (autocommit), no key;
- ``fresh``: the tool through :class:`receiver.contrib.pydantic_ai.ActionTools`, every run a
  new turn (claim, the row and the completion in one transaction, the ordinal read from the
  history);
- ``replay``: the same turns again, answered from the executor's replay cache (no row written);
- ``ledger``: the same turns through a second executor without a cache (another process's view:
  one claim statement answers with the stored result).

The sides take turns in five rounds, so that a drifting machine load is shared by all of them.

Ratio = side's runs per second / direct's, same run. PostgreSQL (database
``receiver_bench_pydantic_ai``, dropped and created again) and a SQLite file. Figures only:
nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from receiver import Actions, Connection, PostgresStore, SQLiteStore, Store, ToolCall
from receiver.contrib.pydantic_ai import ActionTools, Turn

from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_pydantic_ai"
DDL = "CREATE TABLE IF NOT EXISTS bench_pai_refunds (order_id TEXT NOT NULL, cents INTEGER)"
ROUNDS = 5
INSERT = "INSERT INTO bench_pai_refunds (order_id, cents) VALUES ($1, $2)"


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[TextPart("Refunded.")])
    args = {"order_id": "A-1001", "cents": 2599, "reason": "benchmark"}
    return ModelResponse(parts=[ToolCallPart("refund", args)])


def direct_agent(store: Store) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(_script))

    @agent.tool_plain
    async def refund(order_id: str, cents: int, reason: str = "") -> dict[str, Any]:
        async with store.acquire() as conn:
            await conn.execute(INSERT, order_id, cents)
        return {"refunded": cents, "order_id": order_id}

    return agent


def exactly_once_agent(actions: Actions) -> Agent[Turn, str]:
    tools: ActionTools[Turn] = ActionTools(actions)

    @tools.tool(volatile=("reason",))
    async def refund(
        call: ToolCall, tx: Connection, order_id: str, cents: int, reason: str = ""
    ) -> dict[str, Any]:
        await tx.execute(INSERT, order_id, cents)
        return {"refunded": cents, "order_id": order_id}

    return Agent(FunctionModel(_script), deps_type=Turn, toolsets=[tools.toolset])


async def _rate(
    seconds: float, one: Callable[[int], Awaitable[Any]], start: int = 0
) -> tuple[float, int]:
    """Agent runs per second of ``one(n)`` (n = start, start + 1, ...) called in sequence for
    ``seconds``; and how many."""
    counter = itertools.count(start)
    started = time.perf_counter()
    done = 0
    while time.perf_counter() - started < seconds:
        await one(next(counter))
        done += 1
    return done / (time.perf_counter() - started), done


async def measure_store(store: Store, seconds: float) -> dict[str, float]:
    async with store:
        await store.migrate()
        async with store.acquire() as conn:
            await conn.execute(DDL)
        run = f"{time.time_ns()}"
        direct = direct_agent(store)
        keyed = exactly_once_agent(Actions(store, metrics=False, sweep_interval=None))
        uncached = exactly_once_agent(
            Actions(store, metrics=False, sweep_interval=None, replay_cache=0)
        )
        prompt = "Please refund A-1001."
        await direct.run(prompt)  # warm up both paths (schemas, pools, statements)
        await keyed.run(prompt, deps=Turn(f"warm-{run}", 0))

        sides: dict[str, Callable[[int], Awaitable[Any]]] = {
            "direct": lambda n: direct.run(prompt),
            "fresh": lambda n: keyed.run(prompt, deps=Turn(f"bench-{run}", n)),
            # The turns fresh made (at least the first round's), replayed.
            "replay": lambda n: keyed.run(prompt, deps=Turn(f"bench-{run}", n % made)),
            "ledger": lambda n: uncached.run(prompt, deps=Turn(f"bench-{run}", n % made)),
        }
        counts = dict.fromkeys(sides, 0)
        spent = dict.fromkeys(sides, 0.0)
        made = 1
        # Interleaved rounds: the machine's load drifts, and every side sees the same drift.
        for _ in range(ROUNDS):
            for name, one in sides.items():
                rate, done = await _rate(seconds / ROUNDS, one, counts[name])
                counts[name] += done
                spent[name] += done / rate
                if name == "fresh":
                    made = counts["fresh"]
        direct_rps, fresh_rps, replay_rps, ledger_rps = (
            counts[name] / spent[name] for name in sides
        )
    us = {name: 1e6 / rps for name, rps in (("direct", direct_rps), ("fresh", fresh_rps))}
    return {
        "direct_rps": round(direct_rps),
        "fresh_rps": round(fresh_rps),
        "replay_rps": round(replay_rps),
        "ledger_rps": round(ledger_rps),
        "fresh_ratio": round(fresh_rps / direct_rps, 3),
        "replay_ratio": round(replay_rps / direct_rps, 3),
        "ledger_ratio": round(ledger_rps / direct_rps, 3),
        "overhead_fresh_us": round(us["fresh"] - us["direct"]),
    }


async def measure(seconds: float, pg_url: str = DEFAULT_PG) -> dict[str, dict[str, float]]:
    await fresh_pg(pg_url)
    out = {"postgresql": await measure_store(PostgresStore(pg_url, max_size=4), seconds)}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = await measure_store(SQLiteStore(Path(tmp) / "pai.db"), seconds)
    return out


def describe(result: dict[str, dict[str, float]]) -> str:
    lines = [
        "pydantic-ai (one agent run = one tool call + one text answer, FunctionModel, sequential;"
        " ratio = runs/s against the plain tool):",
        f"  {'store':<11} {'direct':>7} {'fresh':>7} {'ratio':>6} {'replay':>7} {'ratio':>6}"
        f" {'ledger':>7} {'ratio':>6} {'+us/call':>9}",
    ]
    for store, f in result.items():
        lines.append(
            f"  {store:<11} {f['direct_rps']:>7} {f['fresh_rps']:>7} {f['fresh_ratio']:>6.3f} "
            f"{f['replay_rps']:>7} {f['replay_ratio']:>6.3f} {f['ledger_rps']:>7} "
            f"{f['ledger_ratio']:>6.3f} {f['overhead_fresh_us']:>9}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agents_pydantic_ai")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measured side")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="database to drop and recreate")
    args = parser.parse_args()
    print(describe(asyncio.run(measure(args.seconds, args.pg_url))))


if __name__ == "__main__":
    main()
