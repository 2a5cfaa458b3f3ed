"""``python -m benchmarks.completions``: what a flush of completions costs, per completion, in
the two shapes a batch can take on PostgreSQL.

* **pipelined** (what the receiver sends): the keyed ``complete`` statement once per receipt,
  in one round trip (asyncpg's ``fetchmany``: a Bind/Execute per receipt, one Sync).
* **one statement**: a single ``UPDATE ... FROM unnest(...)`` over the batch, sent as a one-shot
  statement (prepared unnamed, so that PostgreSQL plans it for the batch and the table as they
  are: a kept generic plan of such a join scans a table that was small when it was made,
  ``tests/integration/test_plans.py``). Its Parse/Describe is a round trip of its own.
* **one statement, kept plan**: the same statement from asyncpg's cache, one round trip; shown
  for what planning costs, not as an option (its plan is the hazard above).

On a freshly migrated database with ``--rows`` completed receipts (analyzed), each round claims
a batch of fresh keys with the receiver's ``claim_many`` and completes them; measured per
completion: the database backend's CPU time (its ``/proc`` counters: PostgreSQL must run on
this machine) and this process's CPU time, the median of ``--rounds`` rounds of
``--batches`` batches per shape, the shapes interleaved. Never asserts timings; not run by the
suite.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from receiver._store.queries import queries

from .statements import RESPONSE, fill_completed
from .stores import PostgresTarget

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
Q = queries("postgresql")

ONE_STATEMENT = """
UPDATE receiver_receipts r
SET state = u.state, response_status = u.status, response_content_type = u.content_type,
    response_body = u.body, response_headers = NULL, completed_at = statement_timestamp(),
    request_body = NULL
FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int4[], $6::text[], $7::bytea[])
    AS u(provider, webhook_id, fence, state, status, content_type, body)
WHERE r.provider = u.provider AND r.webhook_id = u.webhook_id AND r.fence = u.fence
  AND r.state COLLATE "C" = 'in_flight'
RETURNING r.provider, r.webhook_id, r.fence
"""

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """Seconds of CPU a process has used (user + system), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _pipelined(conn: asyncpg.Connection) -> Callable[[list[str]], Awaitable[list[Any]]]:
    async def complete(ids: list[str]) -> list[Any]:
        args = [
            ("bench", i, 1, "completed", 200, "application/json", RESPONSE, None, None) for i in ids
        ]
        return list(await conn.fetchmany(Q["complete"], args))

    return complete


def _batch_args(ids: list[str]) -> list[Any]:
    n = len(ids)
    return [["bench"] * n, ids, [1] * n, ["completed"] * n, [200] * n,
            ["application/json"] * n, [RESPONSE] * n]  # fmt: skip


def _one_shot(conn: asyncpg.Connection) -> Callable[[list[str]], Awaitable[list[Any]]]:
    async def complete(ids: list[str]) -> list[Any]:
        statement = await conn.prepare(ONE_STATEMENT)  # unnamed: planned when bound
        return list(await statement.fetch(*_batch_args(ids)))

    return complete


def _kept(conn: asyncpg.Connection) -> Callable[[list[str]], Awaitable[list[Any]]]:
    async def complete(ids: list[str]) -> list[Any]:
        return list(await conn.fetch(ONE_STATEMENT, *_batch_args(ids)))

    return complete


SHAPES = {
    "pipelined": _pipelined,
    "one statement": _one_shot,
    "one statement, kept plan": _kept,
}


async def _claim(conn: asyncpg.Connection, size: int) -> list[str]:
    ids = [f"msg_{uuid.uuid4().hex}" for _ in range(size)]
    await conn.fetch(
        Q["claim_many"], None, ["bench"] * size, ids, [os.urandom(32) for _ in ids],
        ["order.created"] * size, [60.0] * size, [86400.0] * size, [b"x" * 1024] * size,
    )  # fmt: skip
    return ids


async def run(url: str, rows: int, sizes: list[int], rounds: int, batches: int) -> dict[str, Any]:
    await fill_completed(url, rows)
    conn = await asyncpg.connect(url)
    try:
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        shapes = {name: make(conn) for name, make in SHAPES.items()}
        result: dict[str, Any] = {}
        for size in sizes:
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in shapes}
            for _ in range(rounds):
                for name, complete in shapes.items():
                    server = client = 0.0
                    for _ in range(batches):
                        ids = await _claim(conn, size)
                        s0, c0 = _cpu(backend), time.process_time()
                        done = await complete(ids)
                        server += _cpu(backend) - s0
                        client += time.process_time() - c0
                        if len(done) != size:
                            raise RuntimeError(f"{name}: {len(done)} of {size} completed")
                    n = size * batches
                    runs[name].append((server / n * 1e6, client / n * 1e6))
            result[str(size)] = {
                name: {
                    "server_us": statistics.median(s for s, _ in figures),
                    "client_us": statistics.median(c for _, c in figures),
                }
                for name, figures in runs.items()
            }
            print(describe({str(size): result[str(size)]}, header=size == sizes[0]), flush=True)
        return result
    finally:
        await conn.close()


def describe(result: dict[str, Any], header: bool = True) -> str:
    lines = ["batch  shape                      database us  client us  (CPU per completion)"]
    lines = lines if header else []
    for size, shapes in result.items():
        for name, f in shapes.items():
            lines.append(f"{size:>5}  {name:<25} {f['server_us']:12.1f} {f['client_us']:10.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rows", type=int, default=200_000, help="completed receipts first")
    parser.add_argument("--sizes", default="1,4,11,22,64", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200, help="batches per shape and round")
    args = parser.parse_args(argv)
    PostgresTarget(args.pg_url).prepare()
    sizes = [int(s) for s in args.sizes.split(",")]
    asyncio.run(run(args.pg_url, args.rows, sizes, args.rounds, args.batches))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
