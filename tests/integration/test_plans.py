"""Every ledger statement that names a key finds it through the primary key, under the generic
plan that a long-lived prepared statement (asyncpg's cache) ends up with.

The table is filled and analyzed first, as autovacuum would have done in production: on an empty,
never-analyzed table PostgreSQL may pick any index whose leading column matches, and a plan that
walks an index by provider alone reads every receipt of that provider, for every delivery.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from receiver._queries import queries

LITERALS = {
    "text": "'x'",
    "bytea": "'\\x78'::bytea",
    "float8": "1.0",
    "int8": "1",
    "int4": "1",
    "bool": "false",
}

KEYED = sorted(name for name, sql in queries("postgresql").items() if "webhook_id = $2" in sql)


@pytest.fixture
async def analyzed(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("TRUNCATE receiver_receipts, receiver_attempts")
        await conn.execute(
            """
            INSERT INTO receiver_receipts
                (provider, webhook_id, payload_hash, state, fence, claimed_at, lease_until,
                 expires_at)
            SELECT 'acme', 'msg_' || i, sha256(i::text::bytea),
                   CASE WHEN i % 50 = 0 THEN 'in_flight' ELSE 'completed' END, 1,
                   now(), now(), now() + interval '2 days'
            FROM generate_series(1, 2000) AS i
            """
        )
        await conn.execute("ANALYZE receiver_receipts")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn
    finally:
        await conn.execute("TRUNCATE receiver_receipts, receiver_attempts")
        await conn.close()


@pytest.mark.parametrize("name", KEYED)
async def test_keyed_statements_use_the_primary_key(
    analyzed: asyncpg.Connection, name: str
) -> None:
    sql = queries("postgresql")[name]
    types = [p.name for p in (await analyzed.prepare(sql)).get_parameters()]
    await analyzed.execute(f"PREPARE keyed ({', '.join(types)}) AS {sql}")
    try:
        rows = await analyzed.fetch(
            f"EXPLAIN EXECUTE keyed ({', '.join(LITERALS[t] for t in types)})"
        )
    finally:
        await analyzed.execute("DEALLOCATE keyed")
    plan = "\n".join(r[0] for r in rows)
    table = "receiver_attempts" if "FROM receiver_attempts" in sql else "receiver_receipts"
    assert f"{table}_pkey" in plan, plan
    assert f"Seq Scan on {table}" not in plan, plan
