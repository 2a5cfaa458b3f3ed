"""The narrow seam between the ledger and a database.

A :class:`Store` hands out :class:`Connection` objects; the ledger and the handlers talk SQL
through them. Two implementations exist: :class:`~receiver.PostgresStore` (asyncpg) and
:class:`~receiver.SQLiteStore` (aiosqlite, the embedded default). Each translates its driver's
"the database is gone" errors into :class:`~receiver.StoreUnavailable` at this one boundary.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

from ._exceptions import ConfigurationError
from ._queries import queries

Row = Mapping[str, Any]


class Connection(abc.ABC):
    """A database connection lent for one delivery.

    The ``tx`` argument of every handler is a Connection inside the open transaction that will
    also mark the receipt completed: whatever a handler writes through it commits together with
    the receipt, or not at all. Queries use PostgreSQL's ``$1, $2, ...`` placeholders on every
    store (SQLite receives them as ``?1, ?2, ...``). ``raw`` is the driver's own connection
    (``asyncpg.Connection`` or ``aiosqlite.Connection``) for anything else.
    """

    dialect: ClassVar[str]

    @property
    @abc.abstractmethod
    def raw(self) -> Any:
        """The driver's connection object."""

    @abc.abstractmethod
    async def execute(self, query: str, *args: Any) -> None:
        """Run a statement, discarding any result."""

    @abc.abstractmethod
    async def fetch(self, query: str, *args: Any) -> list[Row]:
        """Run a query and return every row, each a mapping of column name to value."""

    async def fetchrow(self, query: str, *args: Any) -> Row | None:
        """Run a query and return its first row, or None."""
        rows = await self.fetch(query, *args)
        return rows[0] if rows else None

    async def fetchval(self, query: str, *args: Any) -> Any:
        """Run a query and return the first column of its first row, or None."""
        row = await self.fetchrow(query, *args)
        return None if row is None else next(iter(row.values()))

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[None]:
        """A transaction (a savepoint when nested) committed on success, rolled back on error."""

    # The ledger's own statements, by name (see receiver/sql/queries.*.sql).

    async def run(self, name: str, *args: Any) -> Row | None:
        return await self.fetchrow(queries(self.dialect)[name], *args)

    async def run_all(self, name: str, *args: Any) -> list[Row]:
        return await self.fetch(queries(self.dialect)[name], *args)


class Store(abc.ABC):
    """Where receipts live. Open it once (the Receiver's lifespan does), then acquire per use."""

    dialect: ClassVar[str]

    @abc.abstractmethod
    async def open(self) -> None:
        """Prepare connections. Must not fail when the database is down: serving will answer
        503 until it is back."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release every connection."""

    @abc.abstractmethod
    def acquire(self) -> AbstractAsyncContextManager[Connection]:
        """Borrow a connection (in autocommit mode) for one delivery."""

    @abc.abstractmethod
    async def migrate(self) -> None:
        """Create the ledger's tables if they do not exist (idempotent)."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the store points, without credentials (for logs and the CLI)."""

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def split_statements(script: str) -> Sequence[str]:
    """Split a schema script into statements (the schemas contain no ';' inside literals)."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def store_from_url(url: str) -> Store:
    """Build a store from a URL: ``postgresql://...`` or ``sqlite:///path/to/file.db``."""
    if url.startswith(("postgresql://", "postgres://")):
        from ._postgres import PostgresStore

        return PostgresStore(url)
    if url.startswith("sqlite://"):
        from ._sqlite import SQLiteStore

        path = url.removeprefix("sqlite://")
        # sqlite:///relative.db -> "relative.db"; sqlite:////abs/path.db -> "/abs/path.db"
        return SQLiteStore(path[1:] if path.startswith("/") else path)
    raise ConfigurationError(
        f"unsupported store URL {url.split('://')[0]!r}://...: use postgresql://user@host/db "
        "or sqlite:///path/to/receipts.db"
    )
