"""SQLite store through aiosqlite: the embedded default, so the receiver runs with no server.

SQLite has one writer at a time. Within a process, deliveries take turns on one connection
(an asyncio lock); across processes on one host, SQLite's own file lock arbitrates and the
primary key is still the arbiter of every claim. The handler transaction holds the write lock
(``BEGIN IMMEDIATE``) until it commits, so keep handlers short on this store.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiosqlite

from ._exceptions import StoreUnavailable
from ._queries import schema
from ._store import Connection, Row, Store, split_statements

# "$1" -> "?1": handlers write PostgreSQL-style placeholders on every store.
_PLACEHOLDER = re.compile(r"\$(\d+)")


def _is_unavailable(exc: sqlite3.Error) -> bool:
    message = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in message or "busy" in message or "unable to open" in message
    )


@contextlib.contextmanager
def _translated() -> Any:
    try:
        yield
    except sqlite3.Error as exc:
        if _is_unavailable(exc):
            raise StoreUnavailable(f"SQLite unavailable: {exc}") from exc
        raise


class SQLiteConnection(Connection):
    dialect = "sqlite"

    def __init__(self, conn: aiosqlite.Connection) -> None:
        super().__init__()
        self._conn = conn
        self._depth = 0

    def _raw(self) -> aiosqlite.Connection:
        return self._conn

    async def _execute(self, query: str, *args: Any) -> None:
        with _translated():
            await self._conn.execute(_PLACEHOLDER.sub(r"?\1", query), args)

    async def _fetch(self, query: str, *args: Any) -> list[Row]:
        with _translated():
            # One hop to aiosqlite's thread (execute, fetch and close the cursor there).
            rows = await self._conn.execute_fetchall(_PLACEHOLDER.sub(r"?\1", query), args)
        return [dict(zip(row.keys(), tuple(row), strict=True)) for row in rows]

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        depth = self._depth
        begin, commit, rollback = (
            ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")
            if depth == 0
            else (f"SAVEPOINT sp{depth}", f"RELEASE sp{depth}", f"ROLLBACK TO sp{depth}")
        )
        with _translated():
            await self._conn.execute(begin)
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            with _translated():
                await self._conn.execute(rollback)
                if depth:
                    await self._conn.execute(f"RELEASE sp{depth}")
            raise
        self._depth -= 1
        with _translated():
            await self._conn.execute(commit)


class SQLiteStore(Store):
    """Receipts in a SQLite file (WAL mode). ``busy_timeout`` bounds how long a delivery waits
    for another process's write before answering 503."""

    dialect = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        clock: Callable[[], float] | None = None,
        group_commit: bool = True,
    ) -> None:
        self.clock = clock
        # Group commit: concurrent claims, and the completions of handlers that never touched
        # tx, share one transaction and one COMMIT (one fsync under synchronous=FULL).
        self.batch_flushes = 1 if group_commit else 0
        self._path = str(path)
        self._busy_timeout = busy_timeout
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return f"sqlite:///{self._path}"

    @property
    def path(self) -> str:
        return self._path

    async def open(self) -> None:
        async with self._lock:
            if self._conn is not None:
                return
            directory = Path(self._path).parent
            if self._path != ":memory:" and not directory.is_dir():
                raise StoreUnavailable(f"SQLite unavailable: directory {directory} does not exist")
            with _translated():
                conn = await aiosqlite.connect(self._path, isolation_level=None)
                conn.row_factory = sqlite3.Row
                await conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                await conn.execute("PRAGMA journal_mode = WAL")
                # FULL: a receipt acknowledged with a 2xx must survive power loss, not only a
                # crash of this process.
                await conn.execute("PRAGMA synchronous = FULL")
                for statement in split_statements(schema("sqlite")):
                    await conn.execute(statement)
            self._conn = conn

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        if self._conn is None:
            await self.open()
        # Deliveries of this process take turns on one connection. The wait is bounded like
        # SQLite's own busy timeout is across processes: past it, the answer is 503.
        try:
            async with asyncio.timeout(self._busy_timeout):
                await self._lock.acquire()
        except TimeoutError:
            raise StoreUnavailable(
                f"SQLite busy: another delivery of this process held the database for over "
                f"{self._busy_timeout:g} s (busy_timeout)"
            ) from None
        try:
            assert self._conn is not None
            yield SQLiteConnection(self._conn)
        finally:
            self._lock.release()

    async def migrate(self) -> None:
        # open() already creates the schema: an embedded store must work with no set-up step.
        await self.open()
