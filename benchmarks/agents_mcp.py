"""What a keyed MCP tool costs: the same tool called directly and through the executor
(``python -m benchmarks.agents_mcp``).

One trivial tool with structured output, registered on one FastMCP server as plain FastMCP
tools (``direct``, ``direct_result``) and through :class:`receiver.contrib.mcp.MCPActions`
(``keyed``). The MCP SDK's own client calls it over the SDK's in-memory transport
(``--transport memory``, the default: no HTTP or pipe, whose cost would hide the executor's)
or over streamable HTTP to a uvicorn server on a loopback port (``--transport http``: what a
remote client sees), from ``--concurrency`` tasks sharing one session. Sides, measured in
alternating rounds (``--rounds``, ``--seconds`` per side and round):

- ``direct``: the plain tool;
- ``direct_result``: the plain tool answering with a ``CallToolResult``, as the keyed tool does
  (the SDK's server checks a plain tool's structured result against its JSON schema on every
  call, with ``jsonschema.validate``, which checks the schema itself first: milliseconds. It
  skips that for a ``CallToolResult``, so a keyed replay can be faster than ``direct``, and this
  side is the executor's like-for-like reference);
- ``fresh``: the keyed tool, a new action id per call (claim, run, store);
- ``replay``: action ids used before, answered from the executor's replay cache;
- ``ledger``: the same ids through a second server whose executor has no cache, as another
  process sees them (one claim statement answers with the stored result).

Calls per second per side, and ratios side / direct and side / direct_result, same run.
PostgreSQL (database ``receiver_bench_agents_mcp``, dropped and created again) and a SQLite
file. Figures only: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel

from receiver import Actions, Connection, PostgresStore, SQLiteStore, Store, ToolCall
from receiver.contrib.mcp import ACTION_ID, MCPActions

from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_agents_mcp"
SIDES = ("direct", "direct_result", "fresh", "replay", "ledger")


class Echo(BaseModel):
    order: str
    ok: bool


def server(store: Store, *, replay_cache: int = 10_000) -> FastMCP:
    """One server with the tool twice: plain (``direct``) and keyed (``keyed``)."""
    mcp = FastMCP("bench", log_level="WARNING")
    actions = Actions(store, metrics=False, replay_cache=replay_cache, sweep_interval=None)

    @mcp.tool()
    async def direct(order: str) -> Echo:
        return Echo(order=order, ok=True)

    # The same, answered as the keyed tool answers (a CallToolResult, validated by pydantic):
    # the SDK then skips its per-call JSON-schema check of the result, as for the keyed tool.
    @mcp.tool()
    async def direct_result(order: str) -> Annotated[CallToolResult, Echo]:
        echo = Echo(order=order, ok=True)
        return CallToolResult(
            content=[TextContent(type="text", text=echo.model_dump_json())],
            structuredContent=echo.model_dump(),
        )

    @MCPActions(mcp, actions, scope="bench").tool(destructive=False)
    async def keyed(call: ToolCall, tx: Connection, order: str) -> Echo:
        return Echo(order=order, ok=True)

    return mcp


@contextlib.asynccontextmanager
async def connect(mcp: FastMCP, transport: str) -> AsyncIterator[ClientSession]:
    if transport == "memory":
        async with create_connected_server_and_client_session(mcp) as session:
            yield session
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    http_server = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(), log_level="warning"))
    serving = asyncio.create_task(http_server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + 10
        while not http_server.started:
            if serving.done() or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's uvicorn server did not start")
            await asyncio.sleep(0.01)
        async with (
            httpx.AsyncClient(timeout=30) as http,
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (r, w, _),
            ClientSession(r, w) as session,
        ):
            await session.initialize()
            yield session
    finally:
        http_server.should_exit = True
        await serving
        sock.close()


async def rate(
    seconds: float, concurrency: int, one: Callable[[int], Awaitable[Any]]
) -> tuple[float, int]:
    """Calls per second of ``concurrency`` tasks calling ``one(n)`` for ``seconds``; and how
    many calls were made."""
    counter = itertools.count()
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            result = await one(next(counter))
            if result.isError:
                raise RuntimeError(f"the tool failed: {result.content}")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started), done


def plain(session: ClientSession, tool: str) -> Callable[[int], Awaitable[Any]]:
    return lambda n: session.call_tool(tool, {"order": f"o-{n}"})


def keyed(
    session: ClientSession, run: str, ids: Callable[[int], int]
) -> Callable[[int], Awaitable[Any]]:
    """Calls of the keyed tool, call ``n`` naming action ``ids(n)`` of this run."""
    return lambda n: session.call_tool(
        "keyed", {"order": f"o-{ids(n)}"}, meta={ACTION_ID: f"{run}-{ids(n)}"}
    )


async def one_store(
    store: Store, seconds: float, rounds: int, transport: str, concurrency: int
) -> dict[str, Any]:
    """The four sides in alternating rounds (direct, fresh, replay, ledger; again), so that a
    shared machine's noise falls on all of them alike."""
    async with store:
        await store.migrate()
        run = f"{time.time_ns()}"
        async with (
            connect(server(store), transport) as session,
            connect(server(store, replay_cache=0), transport) as uncached,
        ):
            await rate(min(seconds, 1.0), concurrency, plain(session, "direct"))  # warm-up
            made = 0
            total = dict.fromkeys(SIDES, 0.0)
            for _ in range(rounds):
                for tool in ("direct", "direct_result"):
                    total[tool] += (await rate(seconds, concurrency, plain(session, tool)))[0]
                new, calls = await rate(seconds, concurrency, keyed(session, run, made.__add__))
                total["fresh"] += new
                made += calls
                # Every id made so far, round and round (made.__rmod__(n) is n % made).
                replayed = keyed(session, run, made.__rmod__)
                total["replay"] += (await rate(seconds, concurrency, replayed))[0]
                ledger = keyed(uncached, run, made.__rmod__)
                total["ledger"] += (await rate(seconds, concurrency, ledger))[0]
    mean = {side: value / rounds for side, value in total.items()}
    figures: dict[str, Any] = {f"{side}_cps": round(value) for side, value in mean.items()}
    for side in SIDES[1:]:
        figures[f"{side}_ratio"] = round(mean[side] / mean["direct"], 3)
    for side in SIDES[2:]:
        figures[f"{side}_ratio_to_result"] = round(mean[side] / mean["direct_result"], 3)
    return figures


async def measure(
    seconds: float,
    rounds: int = 3,
    transport: str = "memory",
    concurrency: int = 8,
    pg_url: str = DEFAULT_PG,
) -> dict[str, Any]:
    """Every figure, per store."""
    await fresh_pg(pg_url)
    sides = (seconds, rounds, transport, concurrency)
    out = {"postgresql": await one_store(PostgresStore(pg_url, max_size=10), *sides)}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = await one_store(SQLiteStore(Path(tmp) / "mcp.db"), *sides)
    return out


def describe(result: dict[str, Any], transport: str, concurrency: int) -> str:
    lines = [
        f"MCP tool, direct vs through the executor ({transport} transport, {concurrency} tasks "
        "on one session; calls/s, and each side / direct, / direct_result):",
        f"  {'store':<11}" + "".join(f" {side:>14}" for side in SIDES),
    ]
    for store, f in result.items():
        lines.append(f"  {store:<11}" + "".join(f" {f[side + '_cps']:>14}" for side in SIDES))
        lines.append(
            f"  {'  / direct':<11} {'':>14}"
            + "".join(f" {f[side + '_ratio']:>14.3f}" for side in SIDES[1:])
        )
        lines.append(
            f"  {'  / result':<11} {'':>14} {'':>14}"
            + "".join(f" {f[side + '_ratio_to_result']:>14.3f}" for side in SIDES[2:])
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agents_mcp")
    parser.add_argument("--seconds", type=float, default=2.0, help="per side and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    parser.add_argument("--transport", choices=["memory", "http"], default="memory")
    parser.add_argument("--concurrency", type=int, default=8, help="tasks on one session")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="database to drop and recreate")
    args = parser.parse_args()
    result = asyncio.run(
        measure(args.seconds, args.rounds, args.transport, args.concurrency, args.pg_url)
    )
    print(describe(result, args.transport, args.concurrency))


if __name__ == "__main__":
    main()
