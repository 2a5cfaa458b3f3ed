"""The Idempotency-Key middleware over HTTP, fresh keys (``python -m benchmarks.keyed_http``).

Three uvicorn servers (one worker each, uvloop and httptools, as the webhook scenarios) on
loopback, the same JSON endpoint behind each, driven in interleaved rounds of one run by wrk
with 64 connections, every request under an Idempotency-Key never sent before:

- ``bare``: the endpoint alone;
- ``hand``: the hand-written middleware of :mod:`benchmarks.keyed` (one
  ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` claim, one UPDATE with the answer, an asyncpg
  pool of 10);
- ``middleware``: :class:`receiver.IdempotencyKeyMiddleware` on a PostgresStore (pool of 10).

Requests per second and p50/p99 from wrk, ratios side by side; after the run, every key the
middleware answered is checked against the ledger (completed once, no key twice). Figures
only, no timing assertion. ``--side`` is how the servers start (an internal flag).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from receiver import IdempotencyKeyMiddleware, PostgresStore

from . import servers
from .agents import _principal, bare_app, fresh_pg
from .keyed import HAND_DDL, HandMiddleware

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
SIDES = ("bare", "hand", "middleware")
BODY = '{"amount":1200,"currency":"usd","customer":"cus_0000000001"}'

# One Idempotency-Key per request, never repeated: the run's prefix, wrk's thread, a counter.
SCRIPT = """
local counter = 0
local prefix = "%(prefix)s-" .. tostring(math.random(1, 1000000000))
request = function()
  counter = counter + 1
  return wrk.format("POST", "/orders", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = '"' .. prefix .. "-" .. counter .. '"',
  }, '%(body)s')
end
"""


def _keyed_url(base: str) -> str:
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path="/receiver_bench_keyed_http"))


def server_app() -> ASGIApp:
    """The app of one side (``BENCH_KEYED_SIDE``), on ``BENCH_KEYED_URL``."""
    side, url = os.environ["BENCH_KEYED_SIDE"], os.environ["BENCH_KEYED_URL"]
    if side == "bare":
        return bare_app()
    if side == "middleware":
        store = PostgresStore(url, max_size=10)

        @contextlib.asynccontextmanager
        async def opened(app: Starlette) -> AsyncIterator[None]:
            async with store:
                yield

        inner = Starlette(routes=bare_app().routes, lifespan=opened)
        return IdempotencyKeyMiddleware(
            inner, store=store, principal=_principal, sweep_interval=None
        )
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def pooled(app: Starlette) -> AsyncIterator[None]:
        state["pool"] = await asyncpg.create_pool(url, min_size=10, max_size=10)
        try:
            yield
        finally:
            await state["pool"].close()

    return _PooledHand(Starlette(routes=bare_app().routes, lifespan=pooled), state)


class _PooledHand(HandMiddleware):
    """The hand-written middleware, on the pool the app's lifespan opened."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app, self._state = app, state

    @property
    def pool(self) -> asyncpg.Pool:
        return self._state["pool"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def __getattr__(name: str) -> Any:
    """``benchmarks.keyed_http:app``, as uvicorn loads it in each side's server."""
    if name == "app":
        return server_app()
    raise AttributeError(name)


def _wrk(port: int, seconds: int, connections: int, prefix: str, work: Path) -> dict[str, float]:
    script = work / f"{prefix}.lua"
    script.write_text(SCRIPT % {"prefix": prefix, "body": BODY})
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/orders",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    latency = {
        p: _ms(m.group(1)) for p in ("50", "99") if (m := re.search(rf"\s{p}%\s+(\S+)", out))
    }
    return {"rps": rate, "non_2xx": int(bad.group(1)) if bad else 0, **latency}


def _ms(text: str) -> float:
    """wrk's latency ("456.00us", "1.23ms", "1.01s") in milliseconds."""
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


async def _check(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT state, count(*) AS n FROM receiver_receipts GROUP BY state")
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT key FROM hand_keys GROUP BY key HAVING count(*) > 1) t"
        )
    finally:
        await conn.close()
    return {**{r["state"]: r["n"] for r in rows}, "hand_keys_twice": twice}


def run(base: str, *, rounds: int = 2, seconds: int = 5, connections: int = 64) -> dict[str, Any]:
    url = _keyed_url(base)
    asyncio.run(fresh_pg(url))
    asyncio.run(_setup(url))
    work = Path(tempfile.mkdtemp(prefix="keyed-http-"))
    figures: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    started = {
        side: servers.Server(
            side,
            "benchmarks.keyed_http",
            workers=1,
            env={"BENCH_KEYED_SIDE": side, "BENCH_KEYED_URL": url},
            log=work / f"{side}.log",
        )
        for side in SIDES
    }
    try:
        for side, server in started.items():  # warm-up: pools filled, statements prepared
            _wrk(server.port, 1, connections, f"warm-{side}", work)
        for n in range(rounds):
            for side, server in started.items():
                figures[side].append(_wrk(server.port, seconds, connections, f"{side}-{n}", work))
    finally:
        for server in started.values():
            server.stop()
    summary: dict[str, Any] = {}
    for side, runs in figures.items():
        summary[side] = {
            "rps": round(statistics.mean(r["rps"] for r in runs), 1),
            "p50_ms": round(statistics.median(r.get("50", 0.0) for r in runs), 2),
            "p99_ms": round(statistics.median(r.get("99", 0.0) for r in runs), 2),
            "non_2xx": sum(int(r["non_2xx"]) for r in runs),
        }
    result = {
        "sides": summary,
        "middleware_vs_hand": round(summary["middleware"]["rps"] / summary["hand"]["rps"], 2),
        "middleware_vs_bare": round(summary["middleware"]["rps"] / summary["bare"]["rps"], 3),
        "hand_vs_bare": round(summary["hand"]["rps"] / summary["bare"]["rps"], 3),
        "ledger": asyncio.run(_check(url)),
        "rounds": rounds,
        "seconds": seconds,
        "connections": connections,
    }
    ledger = result["ledger"]
    result["ok"] = (
        not any(s["non_2xx"] for s in summary.values())
        and set(ledger) <= {"completed", "hand_keys_twice"}
        and ledger["hand_keys_twice"] == 0
    )
    return result


async def _setup(url: str) -> None:
    store = PostgresStore(url)
    await store.migrate()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(HAND_DDL)
    finally:
        await conn.close()


def describe(r: dict[str, Any]) -> str:
    lines = [
        f"{side:11} {s['rps']:>9,.0f} req/s  p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms"
        f"  non-2xx {s['non_2xx']}"
        for side, s in r["sides"].items()
    ]
    lines.append(
        f"middleware / hand-written {r['middleware_vs_hand']:.2f}x; of bare: middleware "
        f"{r['middleware_vs_bare']:.3f}, hand-written {r['hand_vs_bare']:.3f}"
    )
    lines.append(f"ledger {r['ledger']}; checks " + ("ok" if r["ok"] else "FAILED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keyed_http", description=__doc__)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--json", type=Path, help="write the figures there too")
    args = parser.parse_args(argv)
    began = time.monotonic()
    result = run(
        args.pg_url, rounds=args.rounds, seconds=args.seconds, connections=args.connections
    )
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    print(describe(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
