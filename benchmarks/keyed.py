"""Fresh keys of the agent half, batched or one statement each, against the hand-written
middleware (``python -m benchmarks.keyed``). In-process through ASGI (no HTTP), PostgreSQL,
32 concurrent tasks, interleaved rounds of one run:

- ``hand``: a hand-written Idempotency-Key middleware: one ``INSERT ... ON CONFLICT DO
  NOTHING RETURNING`` claim and one UPDATE with the answer, on an asyncpg pool of 10;
- ``middleware``: :class:`receiver.IdempotencyKeyMiddleware` on a store that batches
  (``batch_flushes`` default), ``middleware_solo`` on one that does not (``batch_flushes=0``);
- ``executor`` / ``executor_solo``: ``Actions.execute`` of fresh actions of a no-op tool, 32
  concurrent, on the same two stores.

The executor claims and completes one key per statement on either store; routing it through
the shared batched statements (receiver/_ledger/shared.py) was measured with this module at
0.41-0.58x of the one-statement path and not kept. The middleware does go through them (where
the store batches): in-process with 32 callers the batched path measured 0.58x, but over HTTP
at 64 connections (``python -m benchmarks.keyed_http``), where the database's CPU per request
is what limits both sides, 1.1-1.6x the hand-written middleware (docs/performance/index.md).

Requests (or actions) per second; ratios side by side. Figures only, no assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Awaitable
from typing import Any

import asyncpg
from starlette.types import ASGIApp, Receive, Scope, Send

from receiver import Actions, Connection, IdempotencyKeyMiddleware, PostgresStore, ToolCall

from .agents import _call, _principal, _rate, agents_url, bare_app, fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
HAND_DDL = (
    "CREATE TABLE IF NOT EXISTS hand_keys (key text PRIMARY KEY, fingerprint bytea NOT NULL, "
    "status int, body bytea)"
)


class HandMiddleware:
    """What a careful engineer writes: claim, run, store the answer; a replay for a key done."""

    def __init__(self, app: ASGIApp, pool: asyncpg.Pool) -> None:
        self.app, self.pool = app, pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
        message = await receive()
        body = message.get("body", b"")
        fingerprint = hashlib.sha256(body).digest()
        claimed = await self.pool.fetchval(
            "INSERT INTO hand_keys (key, fingerprint) VALUES ($1, $2) "
            "ON CONFLICT (key) DO NOTHING RETURNING true",
            key,
            fingerprint,
        )
        if not claimed:
            row = await self.pool.fetchrow("SELECT status, body FROM hand_keys WHERE key = $1", key)
            status = 409 if row is None or row["status"] is None else row["status"]
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b"" if row is None else row["body"]})
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(m: Any) -> None:
            if m["type"] == "http.response.start":
                start.update(m)
            else:
                chunks.append(m.get("body", b""))

        async def replayed() -> Any:
            return message

        await self.app(scope, replayed, capture)
        answer = b"".join(chunks)
        await self.pool.execute(
            "UPDATE hand_keys SET status = $2, body = $3 WHERE key = $1",
            key,
            start["status"],
            answer,
        )
        await send(start)
        await send({"type": "http.response.body", "body": answer})


async def run(url: str, rounds: int, seconds: float) -> dict[str, Any]:
    await fresh_pg(url)
    pool = await asyncpg.create_pool(url, min_size=10, max_size=10)
    await pool.execute(HAND_DDL)
    batched = PostgresStore(url)
    solo = PostgresStore(url, batch_flushes=0)
    await batched.migrate()
    sides: dict[str, list[float]] = {}
    try:
        async with batched, solo:
            apps: dict[str, ASGIApp] = {
                "hand": HandMiddleware(bare_app(), pool),
                "middleware": IdempotencyKeyMiddleware(
                    bare_app(), store=batched, principal=_principal, sweep_interval=None
                ),
                "middleware_solo": IdempotencyKeyMiddleware(
                    bare_app(), store=solo, principal=_principal, sweep_interval=None
                ),
            }
            executors = {
                "executor": Actions(batched, metrics=False, sweep_interval=None),
                "executor_solo": Actions(solo, metrics=False, sweep_interval=None),
            }
            for actions in executors.values():

                @actions.tool("echo")
                async def echo(call: ToolCall, tx: Connection) -> Any:
                    return {"n": call.action.request["n"]}

            for n in range(rounds + 1):  # round 0 warms every side up
                for name, app in apps.items():
                    prefix = f"{name}-{n}-".encode()

                    def one(i: int, app: ASGIApp = app, prefix: bytes = prefix) -> Awaitable[int]:
                        return _call(app, prefix + str(i).encode())

                    rate = await _rate(seconds, one)
                    if n:
                        sides.setdefault(name, []).append(rate)
                for name, actions in executors.items():

                    def act(
                        i: int, actions: Actions = actions, tag: str = f"{name}{n}"
                    ) -> Awaitable[int]:
                        return _execute(actions, tag, i)

                    rate = await _rate(seconds, act)
                    if n:
                        sides.setdefault(name, []).append(rate)
    finally:
        await pool.close()
    mean = {name: round(sum(v) / len(v), 1) for name, v in sides.items()}
    return {
        "per_s": mean,
        "rounds_per_s": sides,
        "middleware_vs_hand": round(mean["middleware"] / mean["hand"], 2),
        "middleware_solo_vs_hand": round(mean["middleware_solo"] / mean["hand"], 2),
        "executor_batched_vs_solo": round(mean["executor"] / mean["executor_solo"], 2),
    }


async def _execute(actions: Actions, tag: str, i: int) -> int:
    action = actions.propose("echo", scope="bench", action_id=f"{tag}-{i}", request={"n": i})
    result = await actions.execute(action)
    return 200 if not result.replayed else 500


def describe(r: dict[str, Any]) -> str:
    p = r["per_s"]
    return (
        f"fresh keys, 32 concurrent, in-process: hand-written {p['hand']:,.0f}/s, middleware "
        f"{p['middleware']:,.0f}/s ({r['middleware_vs_hand']:.2f}x; one statement each: "
        f"{p['middleware_solo']:,.0f}/s, {r['middleware_solo_vs_hand']:.2f}x); executor "
        f"{p['executor']:,.0f}/s batched, {p['executor_solo']:,.0f}/s one statement each "
        f"({r['executor_batched_vs_solo']:.2f}x)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keyed", description=__doc__)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    result = asyncio.run(run(agents_url(args.pg_url), args.rounds, args.seconds))
    print(describe(result))
    print(json.dumps(result["rounds_per_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
