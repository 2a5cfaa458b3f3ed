"""SQLite store through aiosqlite: the embedded default, so the receiver runs with no server.

SQLite has one writer at a time. Within a process, deliveries take turns on one connection
(an asyncio lock); across processes on one host, SQLite's own file lock arbitrates and the
primary key is still the arbiter of every claim. The handler transaction holds the write lock
(``BEGIN IMMEDIATE``) until it commits, so keep handlers short on this store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from .._exceptions import ConfigurationError, StoreMisconfigured, StoreUnavailable
from . import settings
from .base import Connection, Row, Store
from .group_commit import GroupCommit, translated
from .migrations import apply_if_missing
from .queries import queries

# "$1" -> "?1": handlers write PostgreSQL-style placeholders on every store. Only outside string
# literals, quoted identifiers and comments, which are matched whole first: 'price: $2 off'
# stays as written, as it does on PostgreSQL.
_TOKENS = re.compile(
    r"'(?:[^']|'')*'"  # a string literal ('' is an escaped quote)
    r'|"(?:[^"]|"")*"'  # a quoted identifier
    r"|`(?:[^`]|``)*`|\[[^\]]*\]"  # SQLite's other identifier quotes
    r"|--[^\n]*|/\*.*?(?:\*/|\Z)"  # comments
    r"|\$(\d+)",  # a placeholder
    re.DOTALL,
)


def _placeholder(match: re.Match[str]) -> str:
    number = match.group(1)
    return match.group(0) if number is None else f"?{number}"


@functools.lru_cache(maxsize=1024)
def translate(query: str) -> str:
    """The query with PostgreSQL's ``$N`` placeholders as SQLite's ``?N``."""
    return _TOKENS.sub(_placeholder, query) if "$" in query else query


class SQLiteConnection(Connection):
    dialect = "sqlite"

    def __init__(self, conn: aiosqlite.Connection, group: GroupCommit | None = None) -> None:
        super().__init__()
        self._conn = conn
        self._depth = 0
        self._group = group
        #: Set when this connection's work joined a group: its COMMIT is still to come.
        self.pending: asyncio.Future[None] | None = None

    def _raw(self) -> aiosqlite.Connection:
        return self._conn

    async def _outside(self) -> None:
        """A statement outside any transaction of ours: commit an open group first."""
        if self._depth == 0 and self._group is not None and self._group.open:
            await self._group.commit(self._conn)

    async def _execute(self, query: str, *args: Any) -> None:
        await self._outside()
        with translated():
            await self._conn.execute(translate(query), args)

    async def _fetch(self, query: str, *args: Any) -> list[Row]:
        await self._outside()
        with translated():
            # One hop to aiosqlite's thread (execute, fetch and close the cursor there).
            rows = await self._conn.execute_fetchall(translate(query), args)
        return [dict(zip(row.keys(), tuple(row), strict=True)) for row in rows]

    # The ledger's own statements. Inside a transaction of ours (a group member's savepoint, or
    # a transaction of this connection's own) they run on the event loop's thread: holding the
    # write lock they never wait for another writer, and SQLite answers them in microseconds,
    # far less than a hand-off to aiosqlite's thread and back costs under load (benchmarks/
    # benchmarks/README.md, "The Python side"). Whatever may wait stays on aiosqlite's thread: BEGIN
    # IMMEDIATE (another process's write lock, up to busy_timeout), COMMIT (the fsync),
    # statements outside a transaction, and the handlers' own SQL, which may be slow.

    def _inline(self) -> bool:
        return self._depth > 0

    def _here(self, query: str, args: Sequence[Sequence[Any]]) -> list[Row]:
        """Run ``query`` once per argument list, on the calling thread."""
        db = self._conn._conn  # the sqlite3 connection (aiosqlite has no public accessor)
        rows: list[Row] = []
        with translated():
            for one in args:
                for row in db.execute(query, tuple(one)).fetchall():
                    rows.append(dict(zip(row.keys(), tuple(row), strict=True)))
        return rows

    async def run(self, name: str, *args: Any) -> Row | None:
        rows = await self.run_all(name, *args)
        return rows[0] if rows else None

    async def run_all(self, name: str, *args: Any) -> list[Row]:
        if self._inline():
            return self._here(translate(queries(self.dialect)[name]), [args])
        return await super().run_all(name, *args)

    async def run_many(self, name: str, args: Sequence[Sequence[Any]]) -> list[Row]:
        """Every run at once: on the event loop's thread inside a transaction of ours, else in
        one call to aiosqlite's thread."""
        query = translate(queries(self.dialect)[name])
        if self._inline():
            return self._here(query, args)
        await self._outside()
        # aiosqlite runs a function on its thread with _execute (what its own methods use); it
        # has no public equivalent. _here translates SQLite's errors there.
        rows: list[Row] = await self._conn._execute(  # type: ignore[no-untyped-call]
            self._here, query, args
        )
        return rows

    def _savepoint(self, statement: str) -> None:
        """SAVEPOINT, RELEASE or ROLLBACK TO inside a transaction of ours: on this thread."""
        with translated():
            self._conn._conn.execute(statement)

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        if self._depth == 0 and self._group is not None:
            async with self._member():
                yield
            return
        depth = self._depth
        begin, commit, rollback = (
            ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")
            if depth == 0
            else (f"SAVEPOINT sp{depth}", f"RELEASE sp{depth}", f"ROLLBACK TO sp{depth}")
        )
        if depth:
            self._savepoint(begin)
        else:
            with translated():
                await self._conn.execute(begin)
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if depth:
                self._savepoint(rollback)
                self._savepoint(f"RELEASE sp{depth}")
            else:
                with translated():
                    await self._conn.execute(rollback)
            raise
        self._depth -= 1
        if depth:
            self._savepoint(commit)
        else:
            with translated():
                await self._conn.execute(commit)

    @contextlib.asynccontextmanager
    async def _member(self) -> AsyncIterator[None]:
        """This connection's outermost transaction, as a savepoint of the open group."""
        assert self._group is not None
        await self._group.begin(self._conn)
        self._savepoint("SAVEPOINT member")  # the group's transaction is open: ours
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self._savepoint("ROLLBACK TO member")
            self._savepoint("RELEASE member")
            raise
        self._depth = 0
        self._savepoint("RELEASE member")
        self.pending = self._group.join()


class SQLiteStore(Store):
    """Receipts in a SQLite file (WAL mode). ``busy_timeout`` bounds how long a delivery waits
    for another process's write before answering 503.

    An embedded store must work with no set-up step, so opening it applies the schema
    migrations it lacks (one process at a time, under ``BEGIN IMMEDIATE``). With
    ``auto_migrate=False`` it does not: ``receiver migrate`` (or `migrate`) does, and a
    Receiver refuses to start on an older schema, as on PostgreSQL."""

    dialect = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        clock: Callable[[], float] | None = None,
        group_commit: bool = True,
        auto_migrate: bool = True,
    ) -> None:
        # Checked here, not on first use: a path of another type or a busy_timeout that is no
        # number of seconds was accepted, then failed on the first delivery.
        if not isinstance(path, str | Path):
            raise ConfigurationError(
                f"SQLiteStore takes the database file's path (a str or Path), not "
                f"{type(path).__name__}"
            )
        if not str(path) or "\x00" in str(path):
            # "" is a temporary file SQLite deletes at close: a ledger that forgets.
            raise ConfigurationError(
                "SQLiteStore's path is empty or holds a NUL character: give the database "
                "file's path, or ':memory:'"
            )
        busy_timeout = settings.timeout("busy_timeout", busy_timeout, zero=True)
        self.auto_migrate = auto_migrate
        self.clock = clock
        # Group commit: concurrent claims, and the completions of handlers that never touched
        # tx, share one transaction and one COMMIT (one fsync under synchronous=FULL).
        self.batch_flushes = 1 if group_commit else 0
        self._group = GroupCommit() if group_commit else None
        self._waiting = 0  # deliveries waiting for the connection (the group's commit rule)
        self._flusher: asyncio.Task[None] | None = None
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
            with translated():
                # check_same_thread=False: the ledger's statements inside a transaction of ours
                # run on the event loop's thread (SQLiteConnection._inline); the store's lock
                # keeps every use of the connection one at a time.
                pending = aiosqlite.connect(
                    self._path, isolation_level=None, check_same_thread=False
                )
                # aiosqlite's thread is not a daemon: a store nobody closed (a Receiver with no
                # lifespan, a script without `async with`) kept the interpreter from exiting.
                # Nothing acknowledged needs the thread to outlive the program: every commit
                # is durable (synchronous=FULL) before its answer is sent. aiosqlite has no
                # public way to set it (its _thread, like _execute and _conn below).
                pending._thread.daemon = True
                conn = await pending
                try:
                    await self._prepare(conn)
                except BaseException as exc:
                    await conn.close()
                    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
                        # Not a blip: another file is at the ledger's path. Said, not retried.
                        raise StoreMisconfigured(
                            f"SQLite: {self._path} is not a SQLite database (a mistyped path?)"
                        ) from None
                    raise
            self._conn = conn

    async def _prepare(self, conn: aiosqlite.Connection) -> None:
        conn.row_factory = sqlite3.Row
        await conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        await _set_wal(conn, self._busy_timeout)
        # FULL: a receipt acknowledged with a 2xx must survive power loss, not only a crash of
        # this process.
        await conn.execute("PRAGMA synchronous = FULL")
        if self.auto_migrate:
            await apply_if_missing(SQLiteConnection(conn))

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        async with self._lock:
            if self._conn is not None and self._group is not None:
                await self._group.commit(self._conn)
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        if self._conn is None:
            await self.open()
        # Deliveries of this process take turns on one connection. The wait is bounded like
        # SQLite's own busy timeout is across processes: past it, the answer is 503.
        self._waiting += 1
        try:
            async with asyncio.timeout(self._busy_timeout):
                await self._lock.acquire()
        except TimeoutError:
            self._waiting -= 1
            raise StoreUnavailable(
                f"SQLite busy: another delivery of this process held the database for over "
                f"{self._busy_timeout:g} s (busy_timeout)"
            ) from None
        self._waiting -= 1
        lent: SQLiteConnection | None = None
        try:
            assert self._conn is not None
            lent = SQLiteConnection(self._conn, self._group)
            yield lent
        finally:
            try:
                if self._group is not None and self._group.due(self._waiting):
                    await self._group.commit(self._conn)  # type: ignore[arg-type]
            finally:
                self._lock.release()
                if self._group is not None and self._group.open and self._flusher is None:
                    # Left open for the deliveries waiting to join it; should none of them
                    # commit it (they gave up waiting), this does, soon.
                    self._flusher = asyncio.get_running_loop().create_task(self._commit_soon())
        if lent is not None and lent.pending is not None:
            # Durable only once the group commits (perhaps by the next holder of the lock).
            await lent.pending

    async def _commit_soon(self) -> None:
        assert self._group is not None
        try:
            await asyncio.sleep(self._group.max_age)
            async with self._lock:
                if self._conn is not None:
                    # A failed COMMIT reaches its members (503); nothing else to do here.
                    with contextlib.suppress(Exception):
                        await self._group.commit(self._conn)
        finally:
            self._flusher = None


async def _set_wal(conn: aiosqlite.Connection, patience: float) -> None:
    """Switch the file to WAL (a setting kept in the file). Changing the journal mode takes a
    lock that SQLite's busy handler does not wait for: processes opening a new file at once
    could see "database is locked" here, so it is retried for up to ``patience`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        try:
            await conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or loop.time() >= deadline:
                raise
        await asyncio.sleep(0.02)
