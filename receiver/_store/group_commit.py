"""SQLite's group commit: the transactions of concurrent deliveries made durable by one COMMIT.

SQLite has one writer, and under ``synchronous=FULL`` each COMMIT is an fsync. Deliveries that
wait for the writer therefore each run in a SAVEPOINT of one open transaction, and one COMMIT
ends the group (receiver/_store/sqlite.py runs the savepoints; this module decides when to commit
and
tells each member when its work is durable).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from typing import Any

import aiosqlite

from .._exceptions import StoreUnavailable

# SQLite's errors as the store's (StoreUnavailable: locked, busy, unreachable), for the store's
# statements and the group's BEGIN and COMMIT alike.


def is_unavailable(exc: sqlite3.Error) -> bool:
    message = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in message or "busy" in message or "unable to open" in message
    )


@contextlib.contextmanager
def translated() -> Any:
    try:
        yield
    except sqlite3.Error as exc:
        if is_unavailable(exc):
            raise StoreUnavailable(f"SQLite unavailable: {exc}") from exc
        raise


class GroupCommit:
    """Group commit: the transactions of several deliveries, each in a SAVEPOINT of one open
    transaction, made durable by one COMMIT (one fsync under synchronous=FULL).

    A member's savepoint is released when its work succeeds (a failure rolls back its own
    savepoint only); the member then waits, outside the store's lock, for the COMMIT that makes
    it durable, and only then is its answer sent. The group is committed when nobody else is
    waiting for the connection, when it has ``max_members``, when it is older than
    ``max_age`` seconds, or before any statement outside a transaction runs (so that an
    autocommitted statement never lands in someone else's uncommitted transaction).
    """

    def __init__(self, max_members: int = 64, max_age: float = 0.05) -> None:
        self.max_members = max_members
        self.max_age = max_age
        self.open = False
        self.opened_at = 0.0
        self.members: list[asyncio.Future[None]] = []
        self.sizes: list[int] = []  # members per COMMIT, for tests and the benchmark

    async def begin(self, conn: aiosqlite.Connection) -> None:
        if not self.open:
            with translated():
                await conn.execute("BEGIN IMMEDIATE")
            self.open, self.opened_at = True, time.monotonic()

    def join(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.members.append(future)
        return future

    def due(self, waiting: int) -> bool:
        return self.open and (
            waiting == 0
            or len(self.members) >= self.max_members
            or time.monotonic() - self.opened_at >= self.max_age
        )

    async def commit(self, conn: aiosqlite.Connection) -> None:
        if not self.open:
            return
        members, self.members, self.open = self.members, [], False
        if len(self.sizes) < 100_000:
            self.sizes.append(len(members))
        try:
            with translated():
                await conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await conn.execute("ROLLBACK")
            for future in members:
                if not future.done():
                    future.set_exception(
                        exc if isinstance(exc, Exception) else StoreUnavailable("commit failed")
                    )
            raise
        for future in members:
            if not future.done():
                future.set_result(None)
