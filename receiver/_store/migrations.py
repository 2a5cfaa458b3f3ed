"""Versioned schema migrations: numbered SQL files per dialect, each applied once, in order.

The files are ``receiver/_store/sql/migrations/<dialect>/NNNN_name.sql`` (loaded through
importlib.resources, so they travel inside the wheel). A database records what it has in
``receiver_migrations`` (version, name, checksum, applied_at). ``0001_initial`` is the schema of
receiver 0.1.0, which had no migrations table: a database holding the receipts table but no
migrations table is recognised as at 0001 (the baseline), never created again.

Applying (:func:`apply`) is exclusive: on PostgreSQL a session advisory lock (two replicas
starting at once take turns, and the second finds nothing left to do); on SQLite the whole run
is one ``BEGIN IMMEDIATE`` transaction. Each PostgreSQL migration runs in its own transaction
with its record, unless its first line is the marker ``-- receiver: no-transaction``: then its
statements run one by one outside any transaction (``CREATE INDEX CONCURRENTLY`` cannot run in
one), and must be safe to run again after an interruption, which the loader checks for index
builds (``IF NOT EXISTS``) and the runner completes (an INVALID leftover index is dropped first).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.resources
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._exceptions import ConfigurationError, SchemaOutdated
from .queries import runner_queries, split_statements


class Connection(Protocol):
    """What the runner needs of a connection (receiver._store.base.Connection has it): declared
    here, so that the store can call the runner without an import cycle."""

    dialect: str

    async def execute(self, query: str, *args: Any) -> None: ...
    async def fetch(self, query: str, *args: Any) -> list[Mapping[str, Any]]: ...
    async def fetchrow(self, query: str, *args: Any) -> Mapping[str, Any] | None: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...
    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]: ...


class Store(Protocol):
    """What the runner needs of a store (receiver._store.base.Store has it)."""

    @property
    def url(self) -> str: ...
    def acquire(self) -> contextlib.AbstractAsyncContextManager[Connection]: ...


logger = logging.getLogger("receiver.migrations")

NO_TRANSACTION = "-- receiver: no-transaction"

_FILENAME = re.compile(r"(\d{4})_(\w+)\.sql")
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE
)
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
# Seconds between two tries of the advisory lock while another migrator holds it.
_LOCK_POLL = 0.2


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    sql: str
    checksum: str  # sha256 of the file's text, recorded when applied
    transactional: bool

    @property
    def label(self) -> str:
        """``0002_response_headers``: how messages name it (its file name without ``.sql``)."""
        return f"{self.version:04d}_{self.name}"

    def statements(self) -> Sequence[str]:
        return split_statements(self.sql)


def load(dialect: str, texts: dict[str, str]) -> tuple[Migration, ...]:
    """Migrations from ``{file name: text}``, checked: numbered 0001, 0002, ... without gaps,
    and re-runnable where they run outside a transaction."""
    found: list[Migration] = []
    for filename, text in texts.items():
        match = _FILENAME.fullmatch(filename)
        if match is None:
            raise ConfigurationError(
                f"migration file {dialect}/{filename} is not named NNNN_name.sql (e.g. "
                "0004_add_queue.sql)"
            )
        transactional = not text.lstrip().startswith(NO_TRANSACTION)
        for index in _CONCURRENT_INDEX.finditer(text):
            if transactional:
                raise ConfigurationError(
                    f"migration {filename} builds an index CONCURRENTLY, which cannot run in a "
                    f"transaction: make its first line {NO_TRANSACTION!r}"
                )
            if index.group(1) is None:
                raise ConfigurationError(
                    f"migration {filename}: CREATE INDEX CONCURRENTLY {index.group(2)} needs "
                    "IF NOT EXISTS, so that a run interrupted midway can be run again"
                )
        checksum = hashlib.sha256(text.encode("utf-8")).hexdigest()
        found.append(Migration(int(match[1]), match[2], text, checksum, transactional))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ConfigurationError(
            f"the {dialect} migrations must be numbered 1, 2, 3, ... without gaps or repeats, "
            f"not {versions}"
        )
    return tuple(found)


@functools.cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    """The migrations shipped with this version of receiver, oldest first."""
    folder = importlib.resources.files("receiver._store").joinpath("sql", "migrations", dialect)
    texts = {
        entry.name: entry.read_text("utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    }
    return load(dialect, texts)


@dataclass(frozen=True, slots=True)
class Status:
    """Where a database stands against this version's migrations."""

    missing: tuple[Migration, ...]  # not applied yet, oldest first
    changed: tuple[Migration, ...]  # applied from a file whose text has changed since


async def status(conn: Connection) -> Status:
    """Read (never change) what a database has applied. Migrations applied by a newer version
    of receiver are no concern of this one: a rolling deploy runs both for a while."""
    sql = runner_queries(conn.dialect)
    tables = await conn.fetchrow(sql["tables"])
    assert tables is not None
    applied: dict[int, str] = {}
    if tables["migrations"]:
        applied = {int(r["version"]): r["checksum"] for r in await conn.fetch(sql["applied"])}
    known = migrations(conn.dialect)
    if not applied and tables["receipts"]:
        applied = {1: known[0].checksum}  # a 0.1.0 database: the baseline
    return Status(
        missing=tuple(m for m in known if m.version not in applied),
        changed=tuple(m for m in known if applied.get(m.version, m.checksum) != m.checksum),
    )


async def apply(conn: Connection) -> list[str]:
    """Apply what is missing, in order, once each; return the labels applied."""
    sql = runner_queries(conn.dialect)
    applied: list[str] = []
    async with _exclusive(conn):
        # Inside the lock: whatever another migrator applied meanwhile is seen here.
        async with conn.transaction():
            tables = await conn.fetchrow(sql["tables"])
            assert tables is not None
            await conn.execute(sql["create_table"])
            if tables["receipts"] and not await conn.fetch(sql["applied"]):
                baseline = migrations(conn.dialect)[0]
                await conn.execute(sql["record"], 1, baseline.name, baseline.checksum)
                logger.info("recorded the existing 0.1.0 schema as %s", baseline.label)
        found = await status(conn)
        if found.changed:
            raise ConfigurationError(
                "migration file(s) changed after they were applied: "
                f"{', '.join(m.label for m in found.changed)}; never edit an applied migration, "
                "add a new one"
            )
        for migration in found.missing:
            await _apply_one(conn, migration)
            applied.append(migration.label)
            logger.info("applied migration %s", migration.label)
    return applied


async def apply_if_missing(conn: Connection) -> list[str]:
    """:func:`apply`, after a look that takes no lock: opening a current store writes nothing."""
    if not (await status(conn)).missing:
        return []
    return await apply(conn)


async def _apply_one(conn: Connection, migration: Migration) -> None:
    sql = runner_queries(conn.dialect)
    record = (sql["record"], migration.version, migration.name, migration.checksum)
    if migration.transactional or conn.dialect == "sqlite":
        # On SQLite a savepoint inside the run's BEGIN IMMEDIATE: the marker changes nothing.
        async with conn.transaction():
            for statement in migration.statements():
                await conn.execute(statement)
            await conn.execute(*record)
        return
    for statement in migration.statements():
        index = _CONCURRENT_INDEX.search(statement)
        if index is not None and await conn.fetch(sql["invalid_index"], index.group(2)):
            name = index.group(2).lower()
            if not _IDENTIFIER.fullmatch(name):
                raise ConfigurationError(f"migration {migration.label}: bad index name {name!r}")
            logger.warning("dropping index %s, left INVALID by an interrupted build", name)
            await conn.execute(sql["drop_index"].format(index=name))
        await conn.execute(statement)
    await conn.execute(*record)


@contextlib.asynccontextmanager
async def _exclusive(conn: Connection) -> AsyncIterator[None]:
    sql = runner_queries(conn.dialect)
    if conn.dialect == "sqlite":
        async with conn.transaction():  # BEGIN IMMEDIATE: one writer, all or nothing
            yield
        return
    waiting = False
    while not (await conn.fetchval(sql["try_lock"])):
        if not waiting:
            logger.info("another process is migrating this database: waiting for it")
            waiting = True
        await asyncio.sleep(_LOCK_POLL)
    try:
        yield
    except BaseException:
        # Shielded: a cancelled migrator must not leave the lock held on a pooled connection.
        # If the connection itself broke, the session (and its lock) is gone already.
        with contextlib.suppress(Exception):
            await asyncio.shield(conn.execute(sql["unlock"]))
        raise
    await conn.execute(sql["unlock"])


async def missing(store: Store) -> list[str]:
    """The labels of the migrations the store's database lacks (empty when current)."""
    async with store.acquire() as conn:
        return [m.label for m in (await status(conn)).missing]


async def check_current(store: Store) -> None:
    """Refuse to serve on an older schema (SchemaOutdated). An unreachable store raises
    StoreUnavailable: the caller answers 503 and checks again before it serves."""
    lacking = await missing(store)
    if lacking:
        raise SchemaOutdated(
            f"the ledger's schema in {store.url} is older than this version of receiver: "
            f"missing migration(s) {', '.join(lacking)}. Run `receiver migrate --store "
            f"{store.url}` (or Store.migrate()) first; the receiver does not serve on an "
            "older schema"
        )
