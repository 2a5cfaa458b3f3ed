"""A fresh store per scenario, and what it holds afterwards.

PostgreSQL: the database (``receiver_bench`` by default) is dropped and created again, and the
schema applied with the library's own ``migrate()``. SQLite: a new file. The runner reads the
ledger back with the drivers directly (asyncpg, sqlite3), not through the code it measures.
"""

from __future__ import annotations

import asyncio
import collections
import re
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from receiver import PostgresStore, SQLiteStore, Store
from receiver._store.queries import queries

from .business import BUSINESS_DDL, BUSINESS_TABLE, PROVIDER

_CONSTANT = re.compile(
    r"'(?:[^']|'')*'|\$\d+|\b\d+(?:\.\d+)?\b|\b(?:NULL|true|false)\b", re.IGNORECASE
)


def _normal(sql: str) -> str:
    """A statement as pg_stat_statements keeps it, comparable with the library's text: the
    comment lines before it dropped, constants and parameters alike as ``?`` (it replaces
    constants with parameters), whitespace collapsed."""
    lines = sql.strip().splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    text = "\n".join(line.split("--", 1)[0] for line in lines)
    # extract(epoch FROM ...): the field name is a constant to PostgreSQL too
    text = _CONSTANT.sub("?", re.sub(r"extract\(\s*epoch\b", "extract(?", text, flags=re.I))
    return " ".join(text.split()).rstrip(";").strip()


@dataclass
class Snapshot:
    """The ledger and the business table after a scenario."""

    states: dict[str, str]  # webhook_id -> receipt state
    fences: dict[str, int]
    business: collections.Counter[str]  # webhook_id -> business rows

    def with_state(self, state: str) -> set[str]:
        return {k for k, v in self.states.items() if v == state}


_RECEIPTS = "SELECT webhook_id, state, fence FROM receiver_receipts WHERE provider = "
_BUSINESS = f"SELECT webhook_id, count(*) FROM {BUSINESS_TABLE} GROUP BY webhook_id"  # noqa: S608


class PostgresTarget:
    name = "postgresql"

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self.database = parts.path.lstrip("/")
        if not self.database.replace("_", "").isalnum():
            raise ValueError(f"database name {self.database!r}: use letters, digits and _")
        self._admin = urllib.parse.urlunsplit(parts._replace(path="/postgres"))

    def prepare(self) -> None:
        asyncio.run(self._prepare())

    def snapshot(self) -> Snapshot:
        return asyncio.run(self._snapshot())

    def vacuum(self) -> None:
        """``VACUUM (ANALYZE)`` of the database, as autovacuum keeps a production ledger: on a
        server with autovacuum off, a run of several steps would otherwise measure each step
        on the dead tuples and index entries of all those before it."""
        asyncio.run(self._vacuum())

    async def _vacuum(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("VACUUM (ANALYZE)")
        finally:
            await conn.close()

    def describe(self) -> dict[str, str]:
        return asyncio.run(self._describe())

    def stats(self) -> dict[str, int]:
        """The database's transaction and row counters (pg_stat_database). Backends flush them
        when they exit, so read them after the server stopped."""
        return asyncio.run(self._stats())

    async def _stats(self) -> dict[str, int]:
        conn = await asyncpg.connect(self._admin)
        try:
            row = await conn.fetchrow(
                "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted"
                " FROM pg_stat_database WHERE datname = $1",
                self.database,
            )
        finally:
            await conn.close()
        stats = {} if row is None else {k: int(v) for k, v in row.items()}
        # Index entries read, per index of the ledger: a plan that walks a whole index (or a
        # partial index full of dead entries) per statement shows up here, not in the timings.
        conn = await asyncpg.connect(self.url)
        try:
            rows = await conn.fetch(
                "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes"
                " WHERE relname = 'receiver_receipts'"
            )
            heap = await conn.fetchrow(
                "SELECT seq_scan, seq_tup_read, n_dead_tup FROM pg_stat_user_tables"
                " WHERE relname = 'receiver_receipts'"
            )
        finally:
            await conn.close()
        for r in rows:
            stats[f"idx_scan:{r['indexrelname']}"] = int(r["idx_scan"] or 0)
            stats[f"idx_tup_read:{r['indexrelname']}"] = int(r["idx_tup_read"] or 0)
        if heap is not None:
            stats["seq_tup_read:receiver_receipts"] = int(heap["seq_tup_read"] or 0)
        return stats

    def statements(self) -> dict[str, dict[str, float]] | None:
        """pg_stat_statements for this database, by ledger statement name (other statements by
        the start of their text): calls, execution time, WAL bytes, buffers and rows. None when
        the server does not load the extension (``shared_preload_libraries``)."""
        return asyncio.run(self._statements())

    async def _statements(self) -> dict[str, dict[str, float]] | None:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = await conn.fetch(
                "SELECT query, calls, total_exec_time, wal_bytes,"
                " shared_blks_hit + shared_blks_read AS blocks, rows"
                " FROM pg_stat_statements WHERE dbid ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        except asyncpg.PostgresError:
            return None
        finally:
            await conn.close()
        names = {_normal(sql): name for name, sql in queries("postgresql").items()}
        found: dict[str, dict[str, float]] = {}
        for r in rows:
            text = _normal(r["query"])
            name = names.get(text, text[:48])
            entry = found.setdefault(
                name, {"calls": 0, "exec_ms": 0.0, "wal_bytes": 0, "blocks": 0, "rows": 0}
            )
            entry["calls"] += int(r["calls"])
            entry["exec_ms"] += float(r["total_exec_time"])
            entry["wal_bytes"] += int(r["wal_bytes"])
            entry["blocks"] += int(r["blocks"])
            entry["rows"] += int(r["rows"])
        return found

    async def _prepare(self) -> None:
        admin = await asyncpg.connect(self._admin)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            await admin.execute(f"CREATE DATABASE {self.database}")
        finally:
            await admin.close()
        store: Store = PostgresStore(self.url)
        async with store:
            await store.migrate()
            async with store.acquire() as conn:
                await conn.execute(BUSINESS_DDL)

    async def _snapshot(self) -> Snapshot:
        conn = await asyncpg.connect(self.url)
        try:
            rows = await conn.fetch(_RECEIPTS + "$1", PROVIDER)
            business = await conn.fetch(_BUSINESS)
        finally:
            await conn.close()
        return Snapshot(
            {r["webhook_id"]: r["state"] for r in rows},
            {r["webhook_id"]: r["fence"] for r in rows},
            collections.Counter({r[0]: r[1] for r in business}),
        )

    async def _describe(self) -> dict[str, str]:
        conn = await asyncpg.connect(self._admin)
        try:
            version = await conn.fetchval("SHOW server_version")
            rows = await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])",
                [
                    "synchronous_commit",
                    "fsync",
                    "shared_buffers",
                    "max_connections",
                    "autovacuum",
                    "plan_cache_mode",
                ],
            )
        finally:
            await conn.close()
        return {"server_version": version, **{r["name"]: r["setting"] for r in rows}}


class SQLiteTarget:
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"

    def prepare(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        asyncio.run(self._prepare())

    async def _prepare(self) -> None:
        store: Store = SQLiteStore(self.path)
        async with store:
            await store.migrate()
            async with store.acquire() as conn:
                await conn.execute(BUSINESS_DDL)

    def snapshot(self) -> Snapshot:
        conn = sqlite3.connect(self.path)
        try:
            rows = conn.execute(_RECEIPTS + "?", (PROVIDER,)).fetchall()
            business = conn.execute(_BUSINESS).fetchall()
        finally:
            conn.close()
        return Snapshot(
            {r[0]: r[1] for r in rows},
            {r[0]: r[2] for r in rows},
            collections.Counter({r[0]: r[1] for r in business}),
        )

    def stats(self) -> dict[str, int]:
        return {}

    def describe(self) -> dict[str, str]:
        return {"sqlite_version": sqlite3.sqlite_version, "path": str(self.path)}


Target = PostgresTarget | SQLiteTarget
