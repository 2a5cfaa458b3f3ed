"""PostgreSQL store through asyncpg: the production store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg

from .._exceptions import StoreMisconfigured, StoreReadOnly, StoreUnavailable
from . import hosts, settings
from .base import Connection, Row, Store
from .queries import queries

logger = logging.getLogger("receiver.store")

# SQLSTATE classes that mean "the database is not there right now", not "your query is wrong":
# 08 connection exception, 53 insufficient resources, 57P operator intervention (shutdown,
# cannot connect now). See https://www.postgresql.org/docs/current/errcodes-appendix.html
_UNAVAILABLE_SQLSTATES = ("08", "53", "57P")


def is_unavailable(exc: BaseException) -> bool:
    """True for errors that mean the database cannot be reached, as opposed to a bad query."""
    if isinstance(exc, asyncpg.PostgresError):
        return str(exc.sqlstate or "").startswith(_UNAVAILABLE_SQLSTATES)
    return isinstance(
        exc,
        OSError
        | TimeoutError
        | asyncpg.InterfaceError
        | asyncpg.exceptions.ConnectionDoesNotExistError,
    )


# SQLSTATEs (or their classes) that mean the receiver's database is not set up for it, with what
# to do. Only the ledger's own statements and connecting are classified so: the same error from
# a handler's own query is the handler's failure (DESIGN.md: only the store's failures are 503).
_MISCONFIGURED = (
    ("3D000", "the database does not exist: create it, then run `receiver migrate`"),
    ("28", "the server refused the role (unknown role or wrong password): fix the store URL"),
    ("42P01", "the ledger's tables are missing: run `receiver migrate`"),
    ("42703", "the ledger's tables are out of date: run `receiver migrate`"),
    (
        "42P05",  # duplicate_prepared_statement
        "the store URL reaches a connection pooler in transaction mode (PgBouncer, Supavisor, "
        "RDS Proxy), which moves prepared statements between sessions: add ?pooler=transaction "
        "to the store URL",
    ),
    (
        "26000",  # invalid_sql_statement_name: "prepared statement ... does not exist"
        "the store URL reaches a connection pooler in transaction mode (PgBouncer, Supavisor, "
        "RDS Proxy), which moves prepared statements between sessions: add ?pooler=transaction "
        "to the store URL",
    ),
    (
        "42501",
        "the role lacks privileges on the ledger's tables: GRANT SELECT, INSERT, UPDATE, DELETE "
        "ON receiver_receipts, receiver_attempts TO the store URL's role",
    ),
)
_READ_ONLY = "25006"  # read_only_sql_transaction: a standby, or a primary demoted by a failover
# The server asks the client to run the transaction again: serialization_failure (CockroachDB
# and YugabyteDB send it for contention at their default SERIALIZABLE; PostgreSQL at that
# level) and deadlock_detected. For the ledger's own statements that is a blip: 503 with
# Retry-After, and the sender's retry runs the delivery again.
_RETRY_SQLSTATES = ("40001", "40P01")
# check_violation of the constraint that closes a partition the sweep is dropping (the
# partitioned layout, receiver/_store/partitions.py): the receipt is expired and its key is
# about to be free, so the sender's retry is a new delivery.
_CLOSED_PARTITION = re.compile(r"receiver_receipts_p\d+_closed")


def classify(exc: BaseException) -> StoreUnavailable | None:
    """The store error a driver error stands for, or None if it is no store failure. Messages
    carry the SQLSTATE and the fix, never the driver's text (it may hold values or a DSN)."""
    if isinstance(exc, asyncpg.PostgresError):
        state, name = str(exc.sqlstate or ""), type(exc).__name__
        if state == _READ_ONLY:
            return StoreReadOnly(
                f"PostgreSQL is read-only ({name}, SQLSTATE {state}): the store URL reaches a "
                "standby, or the primary failed over; point it at the primary "
                "(target_session_attrs=read-write)"
            )
        for prefix, fix in _MISCONFIGURED:
            if state.startswith(prefix):
                return StoreMisconfigured(f"PostgreSQL: {fix} ({name}, SQLSTATE {state})")
        if state in _RETRY_SQLSTATES:
            return StoreUnavailable(
                f"PostgreSQL asked for the transaction to be retried ({name}, SQLSTATE {state})"
            )
        if state == "23514" and _CLOSED_PARTITION.fullmatch(
            str(getattr(exc, "constraint_name", "") or "")
        ):
            return StoreUnavailable(
                "PostgreSQL: the receipt is in a partition the sweep is dropping; a retry "
                f"finds its key free ({name}, SQLSTATE {state})"
            )
    if is_unavailable(exc):
        return StoreUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}")
    return None


# Prepared statements that vanish or collide between the transactions of one connection: a
# transaction-mode pooler under a store not told about it. Whatever the statement (the ledger's,
# a migration check's or a handler's own), the fix is the store URL's.
_POOLER_SQLSTATES = ("42P05", "26000")


@contextlib.contextmanager
def _translated() -> Any:
    try:
        yield
    except BaseException as exc:
        if is_unavailable(exc):
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}") from exc
        if isinstance(exc, asyncpg.PostgresError) and exc.sqlstate in _POOLER_SQLSTATES:
            error = classify(exc)
            assert error is not None
            raise error from exc
        raise


@contextlib.contextmanager
def _classified() -> Any:
    """Around the ledger's own statements and connecting: every store failure, classified."""
    try:
        yield
    except StoreUnavailable:
        raise
    except BaseException as exc:
        error = classify(exc)
        if error is not None:
            raise error from exc
        raise


async def _connect(dsn: str, **options: Any) -> asyncpg.Connection:
    """The pool's connect: asyncpg's, with every host of a multi-host URL tried when one
    answers as the wrong server (receiver/_store/hosts.py)."""
    options.pop("loop", None)
    return await hosts.connect(dsn, **options)


class PostgresConnection(Connection):
    dialect = "postgresql"

    def __init__(self, conn: asyncpg.Connection) -> None:
        super().__init__()
        self._conn = conn

    def _raw(self) -> asyncpg.Connection:
        return self._conn

    async def run(self, name: str, *args: Any) -> Row | None:
        with _classified():
            return await super().run(name, *args)

    async def run_all(self, name: str, *args: Any) -> list[Row]:
        with _classified():
            return await super().run_all(name, *args)

    async def run_many(self, name: str, args: Sequence[Sequence[Any]]) -> list[Row]:
        # asyncpg's fetchmany: Bind/Execute per argument list and one Sync, in an implicit
        # transaction (all or nothing), one round trip.
        with _classified():
            return list(await self._conn.fetchmany(queries(self.dialect)[name], args))

    async def _execute(self, query: str, *args: Any) -> None:
        with _translated():
            await self._conn.execute(query, *args)

    async def _fetch(self, query: str, *args: Any) -> list[Row]:
        with _translated():
            return list(await self._conn.fetch(query, *args))

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        # asyncpg turns a nested transaction() into a savepoint. Only BEGIN, COMMIT and
        # ROLLBACK are translated here: whatever the body raises (a handler's TimeoutError,
        # OSError or driver misuse) is the body's own failure, never "the store is down".
        transaction = self._conn.transaction()
        with _translated():
            await transaction.start()
        try:
            yield
        except BaseException:
            # A rollback on a connection the body broke can fail too; the body's exception is
            # the one that matters, and asyncpg discards the connection's state on release.
            with contextlib.suppress(Exception):
                await transaction.rollback()
            raise
        with _translated():
            await transaction.commit()


async def _no_reset(conn: asyncpg.Connection) -> None:
    """The ledger keeps no session state (no SET, LISTEN, temp tables or advisory locks), so the
    pool's default reset query on every release is a wasted round trip."""


POOLER_MODES = ("none", "session", "transaction")


def split_pooler(dsn: str) -> tuple[str, str | None, str | None]:
    """The DSN without the receiver's own query parameters, and their values: ``pooler``
    (``transaction`` behind PgBouncer & co in transaction mode) and ``listen_url`` (a direct
    URL for the queued workers' LISTEN). asyncpg would send unknown parameters to the server
    as settings, which a pooler refuses."""
    parts = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k not in ("pooler", "listen_url")]
    found = dict(query)
    clean = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(kept)))
    return clean, found.get("pooler"), found.get("listen_url")


class PostgresStore(Store):
    """Receipts in PostgreSQL.

    Give it a DSN to own a pool (opened by the Receiver's lifespan), or ``pool=`` to share the
    application's existing asyncpg pool (the store then neither opens nor closes it). The pool
    holds at most ``max_size`` connections; ``min_size`` of them are opened in the background
    when the store opens (none by default: each is made on first use). Opening never waits for
    the database, so a receiver starts while it is down and answers 503 until it returns.

    Behind a connection pooler in transaction mode (PgBouncer's ``pool_mode = transaction``,
    Supabase's and Heroku's poolers, Supavisor, RDS Proxy), say so: ``pooler="transaction"``
    or ``?pooler=transaction`` in the URL. Statements are then never kept prepared across
    transactions (asyncpg's statement cache is off), and the queued workers' LISTEN, which
    needs a session of its own, goes to ``listen_url=`` (``?listen_url=`` with the direct URL,
    percent-encoded) or, without one, is replaced by polling. The ledger keeps no other session
    state: no SET, no session advisory lock (migrations take a transaction-level one), no temp
    tables.
    """

    dialect = "postgresql"

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        min_size: int = 0,
        max_size: int = 10,
        acquire_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        clock: Callable[[], float] | None = None,
        batch_flushes: int | None = None,
        pooler: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        self.clock = clock
        min_size, max_size = settings.pool_sizes(min_size, max_size)
        acquire_timeout = settings.timeout("acquire_timeout", acquire_timeout)
        connect_timeout = settings.timeout("connect_timeout", connect_timeout)
        if dsn is not None:
            hosts.check_url(dsn)
            dsn, url_pooler, url_listen = split_pooler(dsn)
            pooler = pooler or url_pooler
            listen_url = listen_url or url_listen
        if pooler is not None and pooler not in POOLER_MODES:
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                f"pooler={pooler!r}: use 'transaction' behind a pooler in transaction mode "
                "(PgBouncer, Supavisor, RDS Proxy), 'session' or 'none' otherwise"
            )
        #: "transaction" behind a transaction-mode pooler: no statement outlives its
        #: transaction, and LISTEN needs ``listen_url``.
        self.pooler = pooler or "none"
        self.listen_url = listen_url
        if batch_flushes is None:
            # Up to 4 batched statements in flight, never more than half the pool: the rest is
            # for handlers' transactions.
            batch_flushes = min(4, max_size // 2)
        if (
            isinstance(batch_flushes, bool)
            or not isinstance(batch_flushes, int)
            or not 0 <= batch_flushes < max_size
        ):
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                f"batch_flushes={batch_flushes} must be between 0 (no batching) and "
                f"max_size - 1 ({max_size - 1}): each flush in flight holds a pooled connection"
            )
        self.batch_flushes = batch_flushes
        if (dsn is None) == (pool is None):
            from .._exceptions import ConfigurationError

            raise ConfigurationError("PostgresStore needs exactly one of dsn= or pool=")
        self._dsn = dsn
        self._pool = pool
        self._owns_pool = pool is None
        self._min_size = min_size
        self._max_size = max_size
        self._acquire_timeout = acquire_timeout
        self._connect_timeout = connect_timeout
        self._opening = asyncio.Lock()
        self._warming: asyncio.Task[None] | None = None
        self._aside: asyncpg.Connection | None = None
        self._aside_lock = asyncio.Lock()

    @property
    def concurrency(self) -> int:
        if self._pool is not None and not self._owns_pool:
            return int(self._pool.get_max_size())
        return self._max_size

    @property
    def url(self) -> str:
        if self._dsn is None:
            return "postgresql://(shared pool)"
        parts = urllib.parse.urlsplit(self._dsn)
        # The hosts as written, less any password: a multi-host URL (``h1:5432,h2:5432``, for
        # failover) has no single hostname or port to parse.
        userinfo, at, hosts = parts.netloc.rpartition("@")
        hosts = hosts or "localhost"
        netloc = f"{userinfo.split(':', 1)[0]}@{hosts}" if at else hosts
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    async def open(self) -> None:
        async with self._opening:
            if self._pool is not None:
                return
            # min_size=0: opening never fails because the database is down; connections are
            # made on demand, so the receiver answers 503 and recovers when the database returns.
            self._pool = await asyncpg.create_pool(
                self._dsn,
                connect=_connect,  # a multi-host URL's hosts, each tried when one is wrong
                min_size=0,
                max_size=self._max_size,
                reset=_no_reset,
                timeout=self._connect_timeout,
                **self._connect_options(),
            )
            if self._min_size:
                self._warming = asyncio.get_running_loop().create_task(self._warm(self._pool))

    async def _warm(self, pool: asyncpg.Pool) -> None:
        """Open ``min_size`` connections in the background, so that the first deliveries do not
        each wait for a connection to be made; a database that is down now is not an error
        (connections are made on demand when it returns)."""
        held: list[asyncpg.Connection] = []
        try:
            for _ in range(self._min_size):
                held.append(await pool.acquire(timeout=self._connect_timeout))
        except Exception as exc:  # down, refused, timed out: only slower first deliveries
            logger.info(
                "PostgreSQL pool warm-up stopped after %d connections (%s)",
                len(held),
                type(exc).__name__,
            )
        finally:
            for conn in held:
                await pool.release(conn)

    def _connect_options(self) -> dict[str, Any]:
        """Behind a transaction-mode pooler, two transactions of one client connection may run
        on two server sessions: a statement prepared in one is unknown (or a duplicate) in the
        other, so none is kept."""
        return {"statement_cache_size": 0} if self.pooler == "transaction" else {}

    async def close(self) -> None:
        if self._warming is not None:
            warming, self._warming = self._warming, None
            warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await warming
        if self._aside is not None:
            aside, self._aside = self._aside, None
            with contextlib.suppress(Exception):
                await aside.close(timeout=self._connect_timeout)
        if self._pool is not None and self._owns_pool:
            await self._pool.close()
            self._pool = None

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        if self._pool is None:
            await self.open()
        assert self._pool is not None
        with _classified():
            # asyncio.timeout rather than acquire(timeout=...): asyncpg then runs the wait in a
            # task of its own, a measurable cost on every acquisition.
            async with asyncio.timeout(self._acquire_timeout):
                conn = await self._pool.acquire()
        try:
            yield PostgresConnection(conn)
        finally:
            # asyncpg shields the release itself: a cancelled request still hands its
            # connection back (and asyncpg rolls back whatever transaction is left open).
            await self._release(conn)

    async def _release(self, conn: asyncpg.Connection) -> None:
        assert self._pool is not None
        try:
            await self._pool.release(conn)
        except Exception:
            # The connection broke while in use (the database went away). The pool may have
            # dropped it already, so terminate() can fail too; either way it is gone, and a
            # failing clean-up must never replace the answer (503) with a 500.
            with contextlib.suppress(Exception):
                conn.terminate()

    @contextlib.asynccontextmanager
    async def acquire_aside(self) -> AsyncIterator[Connection]:
        """One connection of its own, outside the pool, shared (in turn) by the lease
        extensions of handlers that hold pooled connections in their transactions: with every
        pooled connection taken, an extension must still get through."""
        if self._dsn is None:
            # A shared pool: this store does not know how to connect on its own; size the
            # application's pool for the handlers that extend their leases.
            async with self.acquire() as pooled:
                yield pooled
            return
        async with self._aside_lock:
            conn = self._aside
            if conn is None or conn.is_closed():
                with _translated():
                    conn = await hosts.connect(
                        self._dsn, timeout=self._connect_timeout, **self._connect_options()
                    )
                self._aside = conn
            yield PostgresConnection(conn)

    async def migrate(self) -> list[str]:
        """As `Store.migrate`; behind a transaction-mode pooler, on a session of its own
        (``listen_url``, the direct URL): the migrations' advisory lock is a session's, and
        ``CREATE INDEX CONCURRENTLY`` runs outside any transaction."""
        if self.pooler != "transaction":
            return await super().migrate()
        if self.listen_url is None:
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                "migrations need a session of their own, which a transaction-mode pooler does "
                "not give: run `receiver migrate --store DIRECT_URL`, or give listen_url= (the "
                "direct URL) to the store"
            )
        direct = PostgresStore(self.listen_url, max_size=2, clock=self.clock)
        async with direct:
            return await direct.migrate()

    def listens(self) -> str | None:
        """Where a worker's LISTEN goes ("listen_url", "the store URL"), or None when it cannot
        listen (a transaction-mode pooler and no listen_url, or a shared pool): it polls."""
        if self.listen_url is not None:
            return "listen_url"
        if self._dsn is None or self.pooler == "transaction":
            return None
        return "the store URL"

    async def connect_alone(self) -> asyncpg.Connection:
        """A connection of its own, outside the pool, for a worker's LISTEN (a pooled one
        would carry the LISTEN to its next borrower). The caller closes it."""
        dsn = self.listen_url or (None if self.pooler == "transaction" else self._dsn)
        if dsn is None:
            from .._exceptions import ConfigurationError

            raise ConfigurationError(
                "LISTEN needs a session of its own: give listen_url= (a direct URL) behind a "
                "transaction-mode pooler"
            )
        with _translated():
            return await hosts.connect(dsn, timeout=self._connect_timeout)
