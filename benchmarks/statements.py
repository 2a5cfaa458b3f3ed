"""What each ledger statement costs PostgreSQL, one by one: ``EXPLAIN (ANALYZE, BUFFERS, WAL)``.

``python -m benchmarks.statements`` (``--pg-url``, ``--rows``, ``--repeat``). On a freshly
migrated database filled with ``--rows`` completed receipts (analyzed, as autovacuum would),
it claims fresh keys with the library's own statements, a single claim and a batch of 16
through ``claim_many``, completes them with the keyed ``complete`` (which batched completions
pipeline), and prints per delivery: the WAL records and bytes, shared
buffers hit and dirtied, and the execution time (median of ``--repeat``). Each statement is
measured twice: with the 1 KiB request body written at the claim and nulled at the completion
(what the receiver does, so that recovery can run a stale claim again), and without it (what
"write the body only where recovery needs it" would save). The last line says whether the
completion was a HOT update (it cannot be: ``state`` is in the predicate of the in-flight
partial index).

The statements run in transactions that are rolled back, so the database does not grow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import uuid
from typing import Any

import asyncpg

from receiver import PostgresStore
from receiver._store.queries import queries

from .stores import PostgresTarget

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
BODY = b"x" * 1024
RESPONSE = b'{"id":"msg_0000000000"}'

Q = queries("postgresql")


def _claim_args(ids: list[str], body: bytes | None) -> list[Any]:
    n = len(ids)
    return [
        None,
        ["bench"] * n,
        ids,
        [os.urandom(32) for _ in ids],
        ["order.created"] * n,
        [60.0] * n,
        [86400.0] * n,
        [body] * n,
    ]


def _complete_args(webhook_id: str) -> list[Any]:
    # The keyed statement: batched completions pipeline it once per receipt.
    return ["bench", webhook_id, 1, "completed", 200, "application/json", RESPONSE, None, None]


async def _explain(conn: asyncpg.Connection, sql: str, args: list[Any]) -> dict[str, float]:
    plan = json.loads(
        await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) {sql}", *args)
    )[0]
    top = plan["Plan"]

    def total(key: str) -> float:
        return float(top.get(key, 0))

    return {
        "wal_records": total("WAL Records"),
        "wal_bytes": total("WAL Bytes"),
        "hit": total("Shared Hit Blocks"),
        "dirtied": total("Shared Dirtied Blocks"),
        "ms": float(plan["Execution Time"]),
    }


async def _measure(
    conn: asyncpg.Connection, size: int, body: bytes | None, repeat: int
) -> dict[str, dict[str, float]]:
    runs: dict[str, list[dict[str, float]]] = {"claim": [], "complete": []}
    for _ in range(repeat):
        ids = [f"msg_{uuid.uuid4().hex}" for _ in range(size)]
        tx = conn.transaction()
        await tx.start()
        try:
            runs["claim"].append(await _explain(conn, Q["claim_many"], _claim_args(ids, body)))
            each = [await _explain(conn, Q["complete"], _complete_args(i)) for i in ids]
            runs["complete"].append({k: sum(e[k] for e in each) for k in each[0]})
        finally:
            await tx.rollback()
    return {
        name: {k: statistics.median(r[k] for r in rows) / size for k in rows[0]}
        for name, rows in runs.items()
    }


async def _hot(conn: asyncpg.Connection) -> tuple[int, int]:
    """(completions, of which HOT updates), from this transaction's own counters."""
    counters = (
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
        " WHERE relname = 'receiver_receipts'"
    )
    before = await conn.fetchrow(counters)
    ids = [f"msg_{uuid.uuid4().hex}" for _ in range(200)]
    await conn.fetch(Q["claim_many"], *_claim_args(ids, BODY))
    await conn.fetchmany(Q["complete"], [_complete_args(i) for i in ids])
    after = await conn.fetchrow(counters)
    return (
        int(after["n_tup_upd"]) - int(before["n_tup_upd"]),
        int(after["n_tup_hot_upd"]) - int(before["n_tup_hot_upd"]),
    )


async def fill_completed(url: str, rows: int) -> None:
    """A migrated ledger with ``rows`` completed receipts, analyzed (as autovacuum leaves it)."""
    store = PostgresStore(url)
    async with store:
        await store.migrate()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state, fence,"
            " event_type, claimed_at, lease_until, expires_at, completed_at, response_status,"
            " response_content_type, response_body)"
            " SELECT 'bench', 'seed_' || g, sha256(g::text::bytea), 'completed', 1,"
            " 'order.created', now(), now(), now() + interval '1 day', now(), 200,"
            " 'application/json', $1::bytea FROM generate_series(1, $2) g",
            RESPONSE,
            rows,
        )
        await conn.execute("ANALYZE receiver_receipts")
    finally:
        await conn.close()


async def run(url: str, rows: int, repeat: int) -> dict[str, Any]:
    await fill_completed(url, rows)
    conn = await asyncpg.connect(url)
    try:
        result: dict[str, Any] = {}
        for size in (1, 16):
            for label, body in (("with body", BODY), ("no body", None)):
                result[f"{size} {label}"] = await _measure(conn, size, body, repeat)
        tx = conn.transaction()
        await tx.start()
        try:
            result["hot"] = await _hot(conn)
        finally:
            await tx.rollback()
        return result
    finally:
        await conn.close()


def describe(result: dict[str, Any]) -> str:
    lines = [
        "per delivery      statement   WAL records  WAL bytes  buffers hit  dirtied  exec ms",
    ]
    for case, figures in result.items():
        if case == "hot":
            continue
        size, label = case.split(" ", 1)
        for name, f in figures.items():
            lines.append(
                f"batch {size:>2} {label:<9} {name:<10} {f['wal_records']:11.1f}"
                f" {f['wal_bytes']:10.0f} {f['hit']:12.1f} {f['dirtied']:8.2f} {f['ms']:8.3f}"
            )
    updated, hot = result["hot"]
    lines.append(f"completions that were HOT updates: {hot} of {updated}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rows", type=int, default=200_000, help="completed receipts first")
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args(argv)
    PostgresTarget(args.pg_url).prepare()
    print(describe(asyncio.run(run(args.pg_url, args.rows, args.repeat))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
