"""Every ledger statement that names a key finds it through the primary key, under the generic
plan that a long-lived prepared statement (asyncpg's cache) ends up with.

Twice: on a filled and analyzed table, as autovacuum leaves it in production, and on a freshly
migrated table that was never analyzed (a new deployment, after a TRUNCATE, or while autovacuum
lags behind a busy table). Without statistics PostgreSQL may pick any index whose condition
matches, and a plan that walks a partial index or an index by provider alone reads every entry
of it, for every delivery: a 180 s soak fell from 2,517 to 900 req/s that way (issue 15).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import pytest

from receiver import PostgresStore
from receiver._store.queries import queries
from tests import pgcluster
from tests.conftest import TEST_DATABASE

LITERALS = {
    "text": "'x'",
    "bytea": "'\\x78'::bytea",
    "float8": "1.0",
    "int8": "1",
    "int4": "1",
    "bool": "false",
    "text[]": "'{x}'::text[]",
    "bytea[]": "ARRAY['\\x78'::bytea]",
    "float8[]": "'{1.0}'::float8[]",
    "int8[]": "'{1}'::int8[]",
    "int4[]": "'{1}'::int4[]",
}

KEYED = sorted(name for name, sql in queries("postgresql").items() if "webhook_id = $2" in sql)
BATCHED = sorted(name for name, sql in queries("postgresql").items() if "unnest(" in sql)


FILL = """
    INSERT INTO receiver_receipts
        (provider, webhook_id, payload_hash, state, fence, claimed_at, lease_until, expires_at)
    SELECT 'acme', 'msg_' || i, sha256(i::text::bytea),
           CASE WHEN i % 50 = 0 THEN 'in_flight' WHEN i % 70 = 0 THEN 'failed'
                ELSE 'completed' END, 1,
           now(), now(), now() + interval '2 days'
    FROM generate_series(1, 2000) AS i
"""


async def _fresh(pg_admin_url: str, fill: bool) -> AsyncIterator[asyncpg.Connection]:
    """A database of its own, migrated (and filled), never analyzed."""
    name = f"{TEST_DATABASE}_fresh"
    url = await pgcluster.recreate_database(pg_admin_url, name)
    async with PostgresStore(url) as store:
        await store.migrate()
    conn = await asyncpg.connect(url)
    try:
        if fill:
            await conn.execute(FILL)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn
    finally:
        await conn.close()
        await pgcluster.drop_database(pg_admin_url, name)


@pytest.fixture
async def never_analyzed(pg_admin_url: str) -> AsyncIterator[asyncpg.Connection]:
    async for conn in _fresh(pg_admin_url, fill=True):
        yield conn


@pytest.fixture
async def empty(pg_admin_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Freshly migrated and empty: where asyncpg's first generic plans are made in a new
    deployment (the benchmark's table at its start)."""
    async for conn in _fresh(pg_admin_url, fill=False):
        yield conn


@pytest.fixture(params=["analyzed", "never_analyzed", "empty"])
def planner(request: pytest.FixtureRequest) -> asyncpg.Connection:
    conn: asyncpg.Connection = request.getfixturevalue(request.param)
    return conn


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
async def test_keyed_statements_use_the_primary_key(planner: asyncpg.Connection, name: str) -> None:
    analyzed = planner
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
    # The primary key, or an index whose condition is the whole key (``reopen``'s
    # state = 'failed' may take the partial index of released and failed receipts, which holds
    # the key after the state: one entry per key, as cheap), never a walk by provider alone.
    whole_key = re.search(r"Index Cond: \(\(provider = \$1\).*\(webhook_id = \$2\)\)", plan)
    assert f"{table}_pkey" in plan or whole_key, plan
    assert f"Seq Scan on {table}" not in plan, plan


@pytest.mark.parametrize("name", BATCHED)
async def test_batched_statements_never_scan_the_ledger(
    planner: asyncpg.Connection, name: str
) -> None:
    """A statement over a batch (``unnest`` of arrays) that joins the ledger by key must not
    choose a scan of the ledger for it: on a table that was empty when the generic plan was
    made, an UPDATE ... FROM unnest(...) did, and then read the whole table per flush as it
    grew (the benchmark's fresh-noop scenario: 182 rows read per delivery). Completions are
    therefore sent as the keyed ``complete`` statement, pipelined (asyncpg's fetchmany)."""
    sql = queries("postgresql")[name]
    types = [p.name for p in (await planner.prepare(sql)).get_parameters()]
    params = f"({', '.join(types)})" if types else ""
    await planner.execute(f"PREPARE batched {params} AS {sql}")
    try:
        values = f"({', '.join(LITERALS[t] for t in types)})" if types else ""
        rows = await planner.fetch(f"EXPLAIN EXECUTE batched {values}")
    finally:
        await planner.execute("DEALLOCATE batched")
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on receiver_receipts" not in plan, plan
