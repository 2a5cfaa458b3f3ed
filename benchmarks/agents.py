"""Micro-benchmarks of the agent half: the Idempotency-Key middleware and the action executor
(``python -m benchmarks.agents``; ``python -m benchmarks`` runs it too, ``--agents 0`` skips).

**Middleware.** A trivial Starlette POST endpoint (reads the body, answers a small JSON) alone,
and the same app behind :class:`receiver.IdempotencyKeyMiddleware`, driven in-process through
ASGI by 32 concurrent tasks (no HTTP server or client: their cost would hide the middleware's).
Sides: ``bare``; ``fresh`` (every request a new key: claim, run, store); ``replay`` (keys used
before, answered from the middleware's replay cache); ``ledger`` (the same keys through a
middleware without a cache, as another process sees them: one claim statement answers with the
stored response). Ratio = side / bare, same run.

**Executor.** One trivial tool, called directly (``await tool(call, tx)``) and through
``Actions.execute`` (fresh actions, then replays from the cache and from the ledger),
sequentially: microseconds per action, against the direct call.

PostgreSQL (database ``receiver_bench_agents`` on the benchmark server, dropped and created
again) and a SQLite file. Figures only: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Scope

from receiver import (
    Actions,
    Connection,
    IdempotencyKeyMiddleware,
    PostgresStore,
    SQLiteStore,
    Store,
    ToolCall,
)

CONCURRENCY = 32
BODY = b'{"order":"o-1","amount":1200,"currency":"EUR","note":"benchmark"}'
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_agents"


async def endpoint(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"status": "ok"})


def bare_app() -> Starlette:
    return Starlette(routes=[Route("/orders", endpoint, methods=["POST"])])


def _principal(scope: Scope) -> str:
    return "bench"


async def _call(app: ASGIApp, key: bytes | None) -> int:
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"idempotency-key", key))
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/orders",
        "raw_path": b"/orders",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    done = False
    status = 0

    async def receive() -> Message:
        nonlocal done
        if done:
            return {"type": "http.disconnect"}
        done = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def _rate(seconds: float, one: Callable[[int], Awaitable[int]]) -> float:
    """Requests per second of CONCURRENCY tasks calling ``one(n)`` for ``seconds``."""
    counter = itertools.count()
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            status = await one(next(counter))
            if status >= 300:
                raise RuntimeError(f"unexpected status {status}")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done / (time.perf_counter() - started)


async def middleware(store: Store, seconds: float) -> dict[str, float]:
    bare = bare_app()
    keyed = IdempotencyKeyMiddleware(bare_app(), store=store, principal=_principal)
    # Another process's view: no replay cache, every replay is a claim statement.
    uncached = IdempotencyKeyMiddleware(
        bare_app(), store=store, principal=_principal, replay_cache=0
    )
    run = f"{time.time_ns()}"
    seeded = [f'"{run}-r{n}"'.encode() for n in range(1000)]
    for key in seeded:
        await _call(keyed, key)
    bare_rps = await _rate(seconds, lambda n: _call(bare, None))
    fresh = await _rate(seconds, lambda n: _call(keyed, f'"{run}-f{n}"'.encode()))
    replay = await _rate(seconds, lambda n: _call(keyed, seeded[n % len(seeded)]))
    ledger = await _rate(seconds, lambda n: _call(uncached, seeded[n % len(seeded)]))
    return {
        "bare_rps": round(bare_rps),
        "fresh_rps": round(fresh),
        "replay_rps": round(replay),
        "fresh_ratio": round(fresh / bare_rps, 3),
        "replay_ratio": round(replay / bare_rps, 3),
        "ledger_replay_rps": round(ledger),
        "ledger_replay_ratio": round(ledger / bare_rps, 3),
    }


async def executor(store: Store, seconds: float) -> dict[str, float]:
    actions = Actions(store, metrics=False)

    @actions.tool("echo")
    async def echo(call: ToolCall, tx: Connection) -> Any:
        return {"order": call.request["order"], "ok": True}

    run = f"{time.time_ns()}"
    sample = actions.propose("echo", scope="t", action_id="direct", request={"order": "o"})
    call = ToolCall(sample, 1, "k")

    async def timed(one: Callable[[int], Awaitable[Any]]) -> tuple[float, int]:
        n = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            await one(n)
            n += 1
        return (time.perf_counter() - started) / n * 1e6, n

    async def direct(n: int) -> Any:
        return await echo(call, None)  # type: ignore[arg-type]

    async def fresh(n: int) -> Any:
        action = actions.propose(
            "echo", scope="t", action_id=f"{run}-{n}", request={"order": f"o-{n}"}
        )
        return await actions.execute(action)

    direct_us, _ = await timed(direct)
    fresh_us, made = await timed(fresh)

    async def replay(n: int) -> Any:
        action = actions.propose(
            "echo", scope="t", action_id=f"{run}-{n % made}", request={"order": f"o-{n % made}"}
        )
        return await actions.execute(action)

    replay_us, _ = await timed(replay)
    uncached = Actions(store, metrics=False, replay_cache=0)
    uncached.add_tool("echo", echo)

    async def ledger(n: int) -> Any:
        action = uncached.propose(
            "echo", scope="t", action_id=f"{run}-{n % made}", request={"order": f"o-{n % made}"}
        )
        return await uncached.execute(action)

    ledger_us, _ = await timed(ledger)
    return {
        "direct_us": round(direct_us, 2),
        "execute_fresh_us": round(fresh_us, 1),
        "execute_replay_us": round(replay_us, 1),
        "execute_ledger_replay_us": round(ledger_us, 1),
        "overhead_fresh_us": round(fresh_us - direct_us, 1),
        "overhead_replay_us": round(replay_us - direct_us, 1),
    }


def agents_url(bench_url: str) -> str:
    """The benchmark server's URL with this module's own database."""
    parts = urllib.parse.urlsplit(bench_url)
    return urllib.parse.urlunsplit(parts._replace(path="/receiver_bench_agents"))


async def fresh_pg(url: str) -> None:
    """Drop and create the database of ``url`` (a benchmark's own, never the user's)."""
    parts = urllib.parse.urlsplit(url)
    name = parts.path.lstrip("/")
    if not name.replace("_", "").isalnum():
        raise ValueError(f"database name {name!r}: use letters, digits and _")
    admin = await asyncpg.connect(urllib.parse.urlunsplit(parts._replace(path="/postgres")))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()


async def _one_store(store: Store, seconds: float) -> dict[str, Any]:
    async with store:
        await store.migrate()
        return {
            "middleware": await middleware(store, seconds),
            "executor": await executor(store, seconds),
        }


async def measure(seconds: float, pg_url: str = DEFAULT_PG) -> dict[str, Any]:
    """Every figure, per store."""
    await fresh_pg(pg_url)
    out = {"postgresql": await _one_store(PostgresStore(pg_url, max_size=10), seconds)}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = await _one_store(SQLiteStore(Path(tmp) / "agents.db"), seconds)
    return out


def run(seconds: float, pg_url: str = DEFAULT_PG) -> dict[str, Any]:
    return asyncio.run(measure(seconds, pg_url))


def describe(result: dict[str, Any]) -> str:
    lines = [
        "agents (in-process ASGI, 32 tasks; executor sequential; replay: from this process's "
        "cache, ledger: from the store):",
        f"  {'store':<11} {'bare':>7} {'fresh':>7} {'ratio':>6} {'replay':>7} {'ratio':>6}"
        f" {'ledger':>7} {'ratio':>6}   {'direct':>7} {'execute':>8} {'replay':>7} {'ledger':>7}"
        " (us/action)",
    ]
    for store, figures in result.items():
        m, e = figures["middleware"], figures["executor"]
        lines.append(
            f"  {store:<11} {m['bare_rps']:>7} {m['fresh_rps']:>7} {m['fresh_ratio']:>6.3f} "
            f"{m['replay_rps']:>7} {m['replay_ratio']:>6.3f} {m['ledger_replay_rps']:>7} "
            f"{m['ledger_replay_ratio']:>6.3f}   {e['direct_us']:>7.2f} "
            f"{e['execute_fresh_us']:>8.1f} {e['execute_replay_us']:>7.1f} "
            f"{e['execute_ledger_replay_us']:>7.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agents")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measured side")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="database to drop and recreate")
    args = parser.parse_args()
    print(describe(run(args.seconds, args.pg_url)))


if __name__ == "__main__":
    main()
