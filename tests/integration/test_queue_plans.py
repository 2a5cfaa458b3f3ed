"""The workers' statements that scan (fetch, stale recovery, depth) read only queued or
in-flight rows through their partial indexes, however large the table: a queue that scans its
table slows down as the table grows, and here the table also holds every completed receipt of
the dedup window."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from receiver._store.queries import queries

LITERALS = {"float8": "NULL::float8", "int8": "10", "int4": "10"}


@pytest.fixture
async def big_table(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("TRUNCATE receiver_receipts, receiver_attempts")
        # 20,000 finished receipts, a few queued (some due, some waiting for a retry) and a few
        # in flight: what a busy table looks like.
        await conn.execute(
            """
            INSERT INTO receiver_receipts
                (provider, webhook_id, payload_hash, state, fence, claimed_at, lease_until,
                 expires_at, due_at)
            SELECT 'acme', 'msg_' || i, sha256(i::text::bytea),
                   CASE WHEN i % 1000 = 0 THEN 'queued'
                        WHEN i % 1000 = 1 THEN 'in_flight' ELSE 'completed' END,
                   1, now(), now(), now() + interval '2 days',
                   now() + (i % 3 - 1) * interval '1 minute'
            FROM generate_series(1, 20000) AS i
            """
        )
        await conn.execute("ANALYZE receiver_receipts")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn
    finally:
        await conn.execute("TRUNCATE receiver_receipts, receiver_attempts")
        await conn.close()


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("queue_fetch", "receiver_receipts_due"),
        ("queue_depth", "receiver_receipts_due"),
        ("queue_stale", "receiver_receipts_in_flight"),
    ],
)
async def test_queue_scans_read_only_their_partial_index(
    big_table: asyncpg.Connection, name: str, index: str
) -> None:
    sql = queries("postgresql")[name]
    types = [p.name for p in (await big_table.prepare(sql)).get_parameters()]
    await big_table.execute(f"PREPARE scan ({', '.join(types)}) AS {sql}")
    try:
        rows = await big_table.fetch(
            f"EXPLAIN EXECUTE scan ({', '.join(LITERALS[t] for t in types)})"
        )
    finally:
        await big_table.execute("DEALLOCATE scan")
    plan = "\n".join(r[0] for r in rows)
    assert index in plan, plan
    assert "Seq Scan on receiver_receipts" not in plan, plan
