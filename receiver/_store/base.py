"""The narrow seam between the ledger and a database.

A :class:`Store` hands out :class:`Connection` objects; the ledger and the handlers talk SQL
through them. Two implementations exist: :class:`~receiver.PostgresStore` (asyncpg) and
:class:`~receiver.SQLiteStore` (aiosqlite, the embedded default). Each translates its driver's
"the database is gone" errors into :class:`~receiver.StoreUnavailable` at this one boundary.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

from .._exceptions import ReceiverError
from .queries import queries

Row = Mapping[str, Any]


class Connection(abc.ABC):
    """A database connection lent for one delivery.

    The ``tx`` argument of every handler is a Connection inside the transaction that will also
    mark the receipt completed: whatever a handler writes through it commits together with the
    receipt, or not at all. Queries use PostgreSQL's ``$1, $2, ...`` placeholders on every store
    (SQLite receives them as ``?1, ?2, ...``).

    The handlers' transaction begins with their first statement: a handler that never touches
    ``tx`` costs no BEGIN and no COMMIT, and its receipt is completed by one statement. ``raw``
    is the driver's own connection (``asyncpg.Connection`` or ``aiosqlite.Connection``); inside
    a handler, ``await tx.begin()`` before using it, so that its statements join the transaction.
    """

    dialect: str

    def __init__(self) -> None:
        # The handlers' deferred transaction: entered by the first statement they send.
        self._deferred: AbstractAsyncContextManager[None] | None = None
        self._begun = False

    @property
    def raw(self) -> Any:
        """The driver's connection object."""
        if self._deferred is not None and not self._begun:
            raise ReceiverError(
                "tx.raw is used outside the handlers' transaction: call `await tx.begin()` "
                "first, so that its statements commit (or roll back) with the receipt"
            )
        return self._raw()

    async def begin(self) -> None:
        """Begin the handlers' transaction now (it otherwise begins with their first
        statement). Needed only before using ``raw`` inside a handler."""
        if self._deferred is not None and not self._begun:
            self._begun = True
            try:
                await self._deferred.__aenter__()
            except BaseException:
                # Never begun (no connection to be had, BEGIN refused): nothing to end, and
                # the caller sees this failure, not one from ending what never began.
                self._begun = False
                raise

    async def execute(self, query: str, *args: Any) -> None:
        """Run a statement, discarding any result."""
        await self.begin()
        await self._execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[Row]:
        """Run a query and return every row, each a mapping of column name to value."""
        await self.begin()
        return await self._fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Row | None:
        """Run a query and return its first row, or None."""
        rows = await self.fetch(query, *args)
        return rows[0] if rows else None

    async def fetchval(self, query: str, *args: Any) -> Any:
        """Run a query and return the first column of its first row, or None."""
        row = await self.fetchrow(query, *args)
        return None if row is None else next(iter(row.values()))

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """A transaction (a savepoint when nested) committed on success, rolled back on error."""
        return self._nested()

    @contextlib.asynccontextmanager
    async def _nested(self) -> AsyncIterator[None]:
        await self.begin()
        async with self._transaction():
            yield

    @property
    def in_transaction(self) -> bool:
        """True once the handlers' deferred transaction has begun."""
        return self._deferred is not None and self._begun

    def deferred_transaction(self) -> AbstractAsyncContextManager[None]:
        """The handlers' transaction, begun by their first statement (see the class docstring).
        The ledger's own statements (`run`) never begin it: when the handlers sent none,
        the receipt's completion is a single autocommitted statement."""
        if self._deferred is not None:
            raise RuntimeError("deferred transactions do not nest")
        return _Deferred(self)

    # The driver-specific parts.

    @abc.abstractmethod
    def _raw(self) -> Any: ...

    @abc.abstractmethod
    async def _execute(self, query: str, *args: Any) -> None: ...

    @abc.abstractmethod
    async def _fetch(self, query: str, *args: Any) -> list[Row]: ...

    @abc.abstractmethod
    def _transaction(self) -> AbstractAsyncContextManager[None]: ...

    # The ledger's own statements, by name (see receiver/_store/sql/queries.*.sql). They run in
    # whatever transaction is open, and never begin the handlers' deferred one.

    async def run(self, name: str, *args: Any) -> Row | None:
        rows = await self._fetch(queries(self.dialect)[name], *args)
        return rows[0] if rows else None

    async def run_all(self, name: str, *args: Any) -> list[Row]:
        return await self._fetch(queries(self.dialect)[name], *args)

    async def run_many(self, name: str, args: Sequence[Sequence[Any]]) -> list[Row]:
        """Run the named statement once per argument list; the rows of every run, in order.
        Here one after another, in whatever transaction is open; PostgreSQL pipelines them in
        one round trip, as one atomic unit."""
        query = queries(self.dialect)[name]
        rows: list[Row] = []
        for one in args:
            rows += await self._fetch(query, *one)
        return rows


class _Deferred:
    """:meth:`Connection.deferred_transaction`. A class rather than a generator-based context
    manager: one is entered for every delivery, and a generator's frame, its wrapper and the
    event loop's async generator hooks cost a measurable share of a delivery that writes
    nothing."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def __aenter__(self) -> None:
        conn = self._conn
        if conn._deferred is not None:
            raise RuntimeError("deferred transactions do not nest")
        conn._deferred, conn._begun = conn._transaction(), False

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        conn = self._conn
        try:
            if conn._begun and conn._deferred is not None:
                # Committed on success, rolled back on the body's exception (which propagates).
                await conn._deferred.__aexit__(kind, exc, tb)
        finally:
            conn._deferred, conn._begun = None, False


class LazyConnection(Connection):
    """The handlers' ``tx``: a connection borrowed from the store by the first statement sent
    through it, and handed back when the delivery ends. A handler that never touches ``tx``
    holds no pooled connection (nor SQLite's write lock) however long it runs, so slow handlers
    cannot starve the claims and duplicates of other deliveries."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.dialect = store.dialect
        self._store = store
        self._lent: AbstractAsyncContextManager[Connection] | None = None
        self._conn: Connection | None = None

    async def _borrow(self) -> Connection:
        if self._conn is None:
            lent = self._store.acquire()
            self._conn = await lent.__aenter__()
            self._lent = lent
        return self._conn

    async def close(self) -> None:
        """Hand the connection back, if one was borrowed."""
        lent, self._lent, self._conn = self._lent, None, None
        if lent is not None:
            await lent.__aexit__(None, None, None)

    async def __aenter__(self) -> LazyConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _raw(self) -> Any:
        if self._conn is None:
            raise ReceiverError(
                "tx.raw is used before tx holds a connection: call `await tx.begin()` first"
            )
        return self._conn._raw()

    # The ledger's statements (the fenced completion in the handlers' transaction) go to the
    # borrowed connection's own run methods, which know how its store runs them best.

    async def run(self, name: str, *args: Any) -> Row | None:
        return await (await self._borrow()).run(name, *args)

    async def run_all(self, name: str, *args: Any) -> list[Row]:
        return await (await self._borrow()).run_all(name, *args)

    async def run_many(self, name: str, args: Sequence[Sequence[Any]]) -> list[Row]:
        return await (await self._borrow()).run_many(name, args)

    async def _execute(self, query: str, *args: Any) -> None:
        await (await self._borrow())._execute(query, *args)

    async def _fetch(self, query: str, *args: Any) -> list[Row]:
        return await (await self._borrow())._fetch(query, *args)

    def _transaction(self) -> AbstractAsyncContextManager[None]:
        return _Borrowed(self)


class _Borrowed:
    """:meth:`LazyConnection._transaction`: the borrowed connection's own transaction, the
    connection borrowed on entry (a class, for the reason :class:`_Deferred` gives)."""

    __slots__ = ("_inner", "_lazy")

    def __init__(self, lazy: LazyConnection) -> None:
        self._lazy = lazy
        self._inner: AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> None:
        self._inner = (await self._lazy._borrow())._transaction()
        await self._inner.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool | None:
        assert self._inner is not None
        return await self._inner.__aexit__(kind, exc, tb)


class Store(abc.ABC):
    """Where receipts live. Open it once (the Receiver's lifespan does), then acquire per use.

    The ledger's time (claims, leases, expiry, the sweeper) is the database's own clock, so that
    replicas whose clocks disagree never take over each other's live leases. ``clock`` replaces
    it with a function returning unix seconds: for tests that move time by hand, never for
    several processes at once.
    """

    dialect: ClassVar[str]
    #: An injected ledger clock, or None for the database's (see the class docstring).
    clock: Callable[[], float] | None = None
    #: How many batched statements may be in flight at once (receiver/_ledger/batcher.py); 0: the
    #: store does not batch, every claim and completion is a statement of its own.
    batch_flushes: int = 0

    def now(self) -> float | None:
        """The time to hand the ledger's statements: None means the database's clock."""
        return None if self.clock is None else self.clock()

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

    def lazy(self) -> LazyConnection:
        """A `LazyConnection` (use it with ``async with``): borrows a connection only
        when first used, and hands it back at the end of the block."""
        return LazyConnection(self)

    def acquire_aside(self) -> AbstractAsyncContextManager[Connection]:
        """A connection for a short ledger write that must commit on its own while the caller
        holds another one (a lease extension inside a handler's transaction). Stores whose pool
        can be exhausted by such holders lend one from outside the pool."""
        return self.acquire()

    async def migrate(self) -> list[str]:
        """Apply the schema migrations this database lacks, in order, once each, and return
        their names. Safe to run from several replicas at once (receiver/_store/migrations.py)."""
        from .migrations import apply

        async with self.acquire() as conn:
            return await apply(conn)

    async def missing_migrations(self) -> list[str]:
        """The names of the schema migrations this database lacks (empty when it is current)."""
        from .migrations import missing

        return await missing(self)

    @property
    def concurrency(self) -> int:
        """How many deliveries' statements the store runs at once: its pool size (SQLite: one
        writer). The admission bound on deliveries in progress is derived from it."""
        return 1

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the store points, without credentials (for logs and the CLI)."""

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
