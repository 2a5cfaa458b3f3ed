"""Fixtures: real stores only. SQLite in a temporary file; PostgreSQL found or started by
tests/pgcluster.py, never skipped."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from receiver import PostgresStore, SQLiteStore, Store
from receiver._store import partitions
from receiver.testing import register_profiles
from tests import pgcluster
from tests.pgbouncer import PgBouncer
from tests.support import EFFECTS_DDL

# `scripts/test --hypothesis-profile=deep`: 500 examples per state machine and kit property
# (receiver.testing.examples() raises their usual counts to the profile's).
register_profiles()

# One database per pytest process, so that concurrent runs on one server never share tables.
TEST_DATABASE = f"receiver_test_{os.getpid()}"


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    try:
        url, cluster = pgcluster.find_server()
    except RuntimeError as exc:
        pytest.exit(str(exc), returncode=3)
    yield url
    if cluster is not None:
        cluster.destroy()


async def prepared_database(admin_url: str, database: str, layout: str = "single") -> str:
    """A new, migrated database with the tests' effects table, its receipts table in
    ``layout``: its URL."""
    url = await pgcluster.recreate_database(admin_url, database)
    # The tests never crash this server (the crash, outage and failover tests kill servers of
    # their own), so a commit need not wait for its WAL flush: the throwaway cluster runs with
    # fsync=off for the same reason, and a shared server with fsync=on would otherwise spend
    # most of the suite's time in flushes.
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    finally:
        await admin.close()
    async with PostgresStore(url) as store:
        await store.migrate()
        async with store.acquire() as conn:
            await conn.execute(EFFECTS_DDL)
            await partitions.convert(conn, layout)
    return url


@pytest.fixture(scope="session")
def pg_url(pg_admin_url: str) -> Iterator[str]:
    yield asyncio.run(prepared_database(pg_admin_url, TEST_DATABASE))
    asyncio.run(pgcluster.drop_database(pg_admin_url, TEST_DATABASE))


async def truncate(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "TRUNCATE receiver_receipts, receiver_attempts, receiver_audit, "
            "receiver_console_sessions, receiver_bulk_jobs, receiver_bulk_items, effects"
        )
    finally:
        await conn.close()


def make_store(kind: str, pg_url: str, tmp_path: Path) -> Store:
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "receipts.db")
    return PostgresStore(pg_url, max_size=20)


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[PostgresStore]:
    await truncate(pg_url)
    async with PostgresStore(pg_url, max_size=20) as store:
        yield store


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(tmp_path / "receipts.db") as store:
        yield store


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``single_layout`` is not a case of the partitioned layout (its reason
    says why): its ``partitioned`` parameter is deselected, not skipped."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        marker = item.get_closest_marker("single_layout")
        if marker is not None and not marker.args:
            raise pytest.UsageError(f"{item.nodeid}: single_layout needs its reason")
        on_partitions = callspec is not None and callspec.params.get("store") == "partitioned"
        (dropped if on_partitions and marker is not None else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# The partitioned layout's own database (receiver migrate --layout partitioned).
PARTITIONED_DATABASE = f"receiver_test_partitioned_{os.getpid()}"


@pytest.fixture(scope="session")
def pg_partitioned_url(pg_admin_url: str) -> Iterator[str]:
    yield asyncio.run(prepared_database(pg_admin_url, PARTITIONED_DATABASE, "partitioned"))
    asyncio.run(pgcluster.drop_database(pg_admin_url, PARTITIONED_DATABASE))


@pytest.fixture(params=["sqlite", "postgresql", "partitioned"])
async def store(
    request: pytest.FixtureRequest, pg_url: str, pg_partitioned_url: str, tmp_path: Path
) -> AsyncIterator[Store]:
    """The conformance suite runs every test on both stores, and on PostgreSQL's two layouts
    of the receipts table (partitioned: receiver/_store/partitions.py)."""
    kind = request.param
    url = ""
    if kind != "sqlite":
        url = pg_url if kind == "postgresql" else pg_partitioned_url
        await truncate(url)
    async with make_store(kind, url, tmp_path) as opened:
        yield opened


@pytest.fixture
def store_url(
    request: pytest.FixtureRequest, store: Store, pg_url: str, pg_partitioned_url: str
) -> str:
    """The URL of what ``store`` opened (with its password, where ``store.url`` hides it): for
    a second store or a process of its own on the same ledger."""
    kind = request.node.callspec.params["store"]
    return {"sqlite": store.url, "postgresql": pg_url, "partitioned": pg_partitioned_url}[kind]


# The pooler tests' own database: a pooler keeps server sessions open to the databases it
# served, which would show up in other tests' counts of the test database's connections.
POOLED_DATABASE = f"receiver_test_pooled_{os.getpid()}"


@pytest.fixture(scope="session")
def pooled_database(pg_admin_url: str) -> Iterator[str]:
    """The direct URL of the pooler tests' database, migrated, with the effects table."""
    yield asyncio.run(prepared_database(pg_admin_url, POOLED_DATABASE))
    asyncio.run(pgcluster.drop_database(pg_admin_url, POOLED_DATABASE))


@pytest.fixture(scope="session")
def pgbouncers(pg_admin_url: str, pooled_database: str) -> Iterator[dict[str, PgBouncer]]:
    """Real PgBouncers in front of the test server, one per pooling mode (stopped before the
    pooled database is dropped: fixtures end in reverse order)."""
    started: dict[str, PgBouncer] = {}
    try:
        for mode in ("transaction", "session"):
            started[mode] = PgBouncer(pg_admin_url, mode)
            started[mode].start()
        yield started
    finally:
        for bouncer in started.values():
            bouncer.stop()


@pytest.fixture(params=["transaction", "session"])
def pooled_url(request: pytest.FixtureRequest, pgbouncers: dict[str, PgBouncer]) -> str:
    """The pooler tests' database through a real PgBouncer, in each pooling mode, as a store
    URL that says so (?pooler=...)."""
    mode = str(request.param)
    return pgbouncers[mode].url(POOLED_DATABASE) + f"?pooler={mode}"
