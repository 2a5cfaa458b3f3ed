"""Schema migrations on real databases: a 0.1.0 ledger holding receipts in every state upgrades
without losing or changing one; schema.sql is what the migrations build; concurrent runs apply
each migration once; an interrupted concurrent index build is finished on the next run; a
Receiver refuses to start on an older schema, naming the missing migration."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from receiver import PostgresStore, Provider, Receiver, SchemaOutdated, SQLiteStore, Store
from receiver._store.migrations import migrations
from receiver._store.queries import split_statements
from tests import pgcluster
from tests.servers import ROOT
from tests.support import PROVIDER, SECRET, signed

NOW = time.time()
BODY = orjson.dumps({"type": "order.created", "data": {"order": "o-1"}})
# A stored answer with odd whitespace: it must come back byte for byte after the upgrade.
STORED = b'{"status":  "created",\n "order": "o-1"}'
LATEST = [m.label for m in migrations("postgresql")]


def payload_hash(body: bytes) -> bytes:
    return hashlib.sha256(orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)).digest()


# Receipts in every state, as 0.1.0 left them: (webhook_id, state, fence, lease offset,
# completed, status, body, request body, attempts, last error).
RECEIPTS: list[tuple[Any, ...]] = [
    ("msg_completed", "completed", 1, 50, True, 200, STORED, None, 0, None),
    ("msg_in_flight", "in_flight", 2, 60, False, None, None, BODY, 1, "boom"),
    ("msg_failed", "failed", 3, -5, True, 409, b'{"error":"gone"}', BODY, 3, "RuntimeError"),
    ("msg_released", "released", 2, -1, False, None, None, BODY, 2, "TimeoutError"),
]
ATTEMPTS = [("msg_in_flight", 1), ("msg_failed", 1), ("msg_failed", 2), ("msg_failed", 3)]
ATTEMPTS += [("msg_released", 1), ("msg_released", 2)]


def old_schema(dialect: str) -> list[str]:
    """The 0.1.0 schema (the 0001 migration) as statements."""
    return list(split_statements(migrations(dialect)[0].sql))


@pytest.fixture
async def fresh_pg(pg_admin_url: str) -> AsyncIterator[str]:
    """An empty database of its own (dropped afterwards)."""
    name = f"receiver_mig_{os.getpid()}"
    yield await pgcluster.recreate_database(pg_admin_url, name)
    await pgcluster.drop_database(pg_admin_url, name)


async def pg_at_0_1_0(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in old_schema("postgresql"):
            await conn.execute(statement)
        for wid, state, fence, lease, done, status, body, request, attempts, error in RECEIPTS:
            await conn.execute(
                "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state, fence,"
                " event_type, claimed_at, lease_until, expires_at, completed_at, response_status,"
                " response_content_type, response_body, request_body, attempts, last_error)"
                " VALUES ($1, $2, $3, $4, $5, 'order.created', to_timestamp($6),"
                " to_timestamp($7), to_timestamp($8), to_timestamp($9), $10, $11, $12, $13,"
                " $14, $15)",
                PROVIDER,
                wid,
                payload_hash(BODY),
                state,
                fence,
                NOW - 10,
                NOW + lease,
                NOW + 86400,
                NOW - 9 if done else None,
                status,
                "application/json" if status else None,
                body,
                request,
                attempts,
                error,
            )
        for wid, fence in ATTEMPTS:
            await conn.execute(
                "INSERT INTO receiver_attempts VALUES ($1, $2, $3, to_timestamp($4), $5)",
                PROVIDER,
                wid,
                fence,
                NOW - fence,
                f"attempt {fence} failed",
            )
    finally:
        await conn.close()


def sqlite_at_0_1_0(path: Path) -> None:
    db = sqlite3.connect(path)
    try:
        for statement in old_schema("sqlite"):
            db.execute(statement)
        for wid, state, fence, lease, done, status, body, request, attempts, error in RECEIPTS:
            db.execute(
                "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state, fence,"
                " event_type, claimed_at, lease_until, expires_at, completed_at, response_status,"
                " response_content_type, response_body, request_body, attempts, last_error)"
                " VALUES (?, ?, ?, ?, ?, 'order.created', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    PROVIDER,
                    wid,
                    payload_hash(BODY),
                    state,
                    fence,
                    NOW - 10,
                    NOW + lease,
                    NOW + 86400,
                    NOW - 9 if done else None,
                    status,
                    "application/json" if status else None,
                    body,
                    request,
                    attempts,
                    error,
                ),
            )
        for wid, fence in ATTEMPTS:
            db.execute(
                "INSERT INTO receiver_attempts VALUES (?, ?, ?, ?, ?)",
                (PROVIDER, wid, fence, NOW - fence, f"attempt {fence} failed"),
            )
        db.commit()
    finally:
        db.close()


async def rows(store: Store, table: str) -> list[dict[str, Any]]:
    async with store.acquire() as conn:
        found = await conn.fetch(f"SELECT * FROM {table} ORDER BY webhook_id")
    return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in r.items()} for r in found]


async def applied(store: Store) -> list[tuple[int, str]]:
    async with store.acquire() as conn:
        found = await conn.fetch("SELECT version, name FROM receiver_migrations ORDER BY version")
    return [(int(r["version"]), r["name"]) for r in found]


@pytest.fixture(params=["postgresql", "sqlite"])
async def old_store(
    request: pytest.FixtureRequest, tmp_path: Path, fresh_pg: str
) -> AsyncIterator[tuple[Store, dict[str, list[dict[str, Any]]]]]:
    """A store at the 0.1.0 schema with receipts in every state (not migrated: SQLite's
    auto-migration is off), and its rows as 0.1.0 stored them."""
    if request.param == "postgresql":
        await pg_at_0_1_0(fresh_pg)
        store: Store = PostgresStore(fresh_pg)
    else:
        sqlite_at_0_1_0(tmp_path / "old.db")
        store = SQLiteStore(tmp_path / "old.db", auto_migrate=False)
    async with store:
        before = {t: await rows(store, t) for t in ("receiver_receipts", "receiver_attempts")}
        yield store, before


async def test_a_0_1_0_ledger_migrates_without_losing_or_changing_a_receipt(
    old_store: tuple[Store, dict[str, list[dict[str, Any]]]],
) -> None:
    store, before = old_store
    assert await store.missing_migrations() == LATEST[1:]  # recognised as at 0001

    assert await store.migrate() == LATEST[1:]  # 0001 is recorded, never run again

    assert [label for _, label in await applied(store)] == [m.split("_", 1)[1] for m in LATEST]
    assert await store.missing_migrations() == []
    after = await rows(store, "receiver_receipts")
    assert [r.pop("response_headers") for r in after] == [None] * len(RECEIPTS)
    assert [r.pop("due_at") for r in after] == [None] * len(RECEIPTS)  # 0004: inline receipts
    assert after == before["receiver_receipts"]
    assert await rows(store, "receiver_attempts") == before["receiver_attempts"]

    # The upgraded ledger still answers: the old completed receipt replays byte for byte.
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], metrics=False, sweep_interval=None)
    async with rx:
        replay = await rx.deliver(PROVIDER, signed("msg_completed", BODY), BODY)
    assert replay.status_code == 200
    assert replay.body == STORED
    assert replay.headers["idempotent-replayed"] == "true"


async def test_migrate_twice_applies_nothing_the_second_time(fresh_pg: str) -> None:
    async with PostgresStore(fresh_pg) as store:
        assert await store.missing_migrations() == LATEST
        assert await store.migrate() == LATEST
        assert await store.migrate() == []
        assert len(await applied(store)) == len(LATEST)


async def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The ledger's tables as PostgreSQL's catalog describes them: columns in order with their
    types, nullability and defaults; constraints; indexes (receiver_migrations excluded: the
    runner's own table, not part of the documented schema)."""
    tables = "('receiver_receipts', 'receiver_attempts')"
    queries = {
        "columns": "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),"
        " a.attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid"
        " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        f" WHERE c.relname IN {tables} AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY 1, 2",
        "constraints": "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)"
        f" FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid WHERE c.relname IN {tables}"
        " ORDER BY 1, 2",
        "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes"
        f" WHERE tablename IN {tables} ORDER BY 1, 2",
        "valid": "SELECT c.relname, i.indisvalid FROM pg_index i"
        f" JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
        f" WHERE t.relname IN {tables} ORDER BY 1",
    }
    conn = await asyncpg.connect(url)
    try:
        return {name: [tuple(r) for r in await conn.fetch(sql)] for name, sql in queries.items()}
    finally:
        await conn.close()


async def test_schema_sql_is_what_the_migrations_build(fresh_pg: str, pg_admin_url: str) -> None:
    documented = f"receiver_doc_{os.getpid()}"
    doc_url = await pgcluster.recreate_database(pg_admin_url, documented)
    try:
        conn = await asyncpg.connect(doc_url)
        try:
            for statement in split_statements((ROOT / "schema.sql").read_text()):
                await conn.execute(statement)
        finally:
            await conn.close()
        async with PostgresStore(fresh_pg) as store:
            await store.migrate()
        migrated, expected = await catalog(fresh_pg), await catalog(doc_url)
    finally:
        await pgcluster.drop_database(pg_admin_url, documented)
    assert migrated["columns"]  # the comparison compared something
    assert migrated == expected


async def test_concurrent_migrate_runs_apply_each_migration_once(fresh_pg: str) -> None:
    stores = [PostgresStore(fresh_pg, max_size=1) for _ in range(4)]
    try:
        # Each run on its own connection, all started together, as replicas starting at once.
        results = await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        for s in stores:
            await s.close()
    assert sorted(label for result in results for label in result) == LATEST
    async with PostgresStore(fresh_pg) as store:
        assert [v for v, _ in await applied(store)] == list(range(1, len(LATEST) + 1))
    assert all(valid for _, valid in (await catalog(fresh_pg))["valid"])


async def test_concurrent_sqlite_opens_apply_each_migration_once(tmp_path: Path) -> None:
    """Six processes' worth of stores open one new file at once, 30 times over: each migration
    is applied once, and none fails on the lock that switching the file to WAL takes (SQLite's
    busy handler does not wait for it: about one round in ten failed before it was retried)."""
    for n in range(30):
        stores = [SQLiteStore(tmp_path / f"r{n}.db") for _ in range(6)]
        try:
            await asyncio.gather(*(s.open() for s in stores))
            assert [v for v, _ in await applied(stores[0])] == list(range(1, len(LATEST) + 1))
        finally:
            for s in stores:
                await s.close()


async def test_an_interrupted_concurrent_index_build_is_finished_by_the_next_run(
    fresh_pg: str,
) -> None:
    index = "receiver_receipts_released_failed"
    async with PostgresStore(fresh_pg) as store:
        await store.migrate()
        async with store.acquire() as conn:
            await conn.execute(f"DROP INDEX {index}")
            await conn.execute("DELETE FROM receiver_migrations WHERE version = 3")
            for wid in ("a", "b"):  # two released receipts: a UNIQUE build of the index fails
                await conn.execute(
                    "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state,"
                    " claimed_at, lease_until, expires_at) VALUES ('p', $1, '\\x00', 'released',"
                    " now(), now(), now() + interval '1 day')",
                    wid,
                )
            # What a build killed midway leaves behind: an INVALID index of that name.
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(
                    f"CREATE UNIQUE INDEX CONCURRENTLY {index} ON receiver_receipts"
                    " (provider, state) WHERE state IN ('released', 'failed')"
                )
        assert (index, False) in (await catalog(fresh_pg))["valid"]

        assert await store.migrate() == [LATEST[2]]

    found = await catalog(fresh_pg)
    assert (index, True) in found["valid"]
    (built,) = [d for _, name, d in found["indexes"] if name == index]
    assert "UNIQUE" not in built
    assert "(provider, state, webhook_id)" in built  # the migration's index, not the leftover


async def test_a_changed_migration_file_is_refused(fresh_pg: str) -> None:
    async with PostgresStore(fresh_pg) as store:
        await store.migrate()
        async with store.acquire() as conn:
            await conn.execute("UPDATE receiver_migrations SET checksum = 'x' WHERE version = 2")
        with pytest.raises(Exception, match="0002_response_headers"):
            await store.migrate()


async def test_a_receiver_on_an_old_schema_refuses_to_start(
    old_store: tuple[Store, dict[str, list[dict[str, Any]]]],
) -> None:
    store, _ = old_store
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], sweep_interval=None)
    with pytest.raises(SchemaOutdated, match="0002_response_headers") as refused:
        async with rx.lifespan():
            pass
    assert "receiver migrate" in str(refused.value)
    await store.migrate()
    async with rx.lifespan():
        pass  # current now: it starts


async def test_an_embedded_store_migrates_itself_on_open(tmp_path: Path) -> None:
    """SQLite needs no set-up step: a 0.1.0 file is upgraded when the store opens."""
    sqlite_at_0_1_0(tmp_path / "old.db")
    async with SQLiteStore(tmp_path / "old.db") as store:
        assert await store.missing_migrations() == []
        assert len(await rows(store, "receiver_receipts")) == len(RECEIPTS)
