"""Real stores for tests: a throwaway SQLite file by default, or a throwaway database on the
PostgreSQL server named by ``RECEIVER_TEST_PG_URL``. Never a fake ledger: the unique
constraint is the thing under test."""

from __future__ import annotations

import itertools
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import asyncpg

from .._store.base import Store
from .._store.postgres import PostgresStore
from .._store.sqlite import SQLiteStore

#: Set it to a PostgreSQL server you can ``CREATE DATABASE`` on to test on PostgreSQL.
PG_URL_VARIABLE = "RECEIVER_TEST_PG_URL"

# Test plumbing, not ledger statements: these run on the kit's own throwaway database only.
# Emptied: the ledger's receipts and attempts and every table of the user's; kept: any other
# receiver_ table (a schema version must survive, or the store would refuse to serve).
_TABLES = (
    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    " AND (tablename IN ('receiver_receipts', 'receiver_attempts')"
    " OR tablename NOT LIKE 'receiver\\_%')"
)


def _with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


class TestStores:
    """Hands out fresh, unopened stores of one kind. ``kind`` is ``"sqlite"`` or
    ``"postgresql"``; each `fresh` store starts empty (a new file, or every table of the
    throwaway database truncated: the ledger's and the handlers' own)."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, directory: Path, pg_url: str | None = None) -> None:
        self.kind = "sqlite" if pg_url is None else "postgresql"
        self.pg_url = pg_url
        self._directory = directory
        self._files = itertools.count(1)

    async def fresh(self, clock: Callable[[], float] | None = None) -> Store:
        """An empty store (not opened: the Receiver opens it). ``clock`` is the store's time
        for leases and expiry (give the test's FakeClock); None is the database's own clock."""
        if self.pg_url is None:
            path = self._directory / f"receipts-{next(self._files)}.db"
            return SQLiteStore(path, clock=clock)
        conn = await asyncpg.connect(self.pg_url)
        try:
            tables = [r["tablename"] for r in await conn.fetch(_TABLES)]
            if tables:
                quoted = ", ".join('"' + t.replace('"', '""') + '"' for t in tables)
                # RESTART IDENTITY: serial ids start at 1 in every test, as on a fresh SQLite
                # file, so that a test passes alone and after another alike.
                await conn.execute(f"TRUNCATE {quoted} RESTART IDENTITY")
        finally:
            await conn.close()
        return PostgresStore(self.pg_url, max_size=20, clock=clock)

    def __repr__(self) -> str:
        return f"TestStores({self.kind})"


async def create_database(admin_url: str) -> str:
    """A new database on the server of ``admin_url`` (one per test process), migrated; its URL."""
    name = f"receiver_kit_{os.getpid()}"
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    url = _with_database(admin_url, name)
    async with PostgresStore(url) as store:
        await store.migrate()
    return url


async def drop_database(admin_url: str, url: str) -> None:
    name = urllib.parse.urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


def pg_admin_url() -> str | None:
    """The PostgreSQL server to test on, if the user named one."""
    return os.environ.get(PG_URL_VARIABLE) or None


def temporary_directory() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="receiver-testing-")
