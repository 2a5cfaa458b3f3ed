"""The partitioned layout of a PostgreSQL ledger: expiry drops a partition of receipts at once
instead of deleting them one by one.

``receiver migrate --layout partitioned`` turns ``receiver_receipts`` into a table partitioned
by a bucket number, with a narrow key table as the arbiter (sql/layouts/partitioned.postgresql.sql
says how the key stays unique); ``--layout single`` turns it back. Every ledger statement runs
unchanged on either layout; only expiry differs. On the partitioned layout the sweep
(:func:`expire`) opens a new partition when the current one has been current for a day, and
drops an older partition once none of its completed receipts is still within its window, in
three steps, each a transaction of its own:

1. move the receipts expiry keeps (in flight, queued, dead letters within their retention) to
   the current partition; their keys follow them;
2. close the partition: a CHECK constraint, not validated, that every row of it stays expired,
   so that a redelivery claiming one of its receipts again fails (and is retried once the key
   is free) instead of reviving a row about to be dropped; adding it waits until every
   transaction that could have changed a row has ended;
3. move what was revived between 1 and 2, delete the partition's keys and attempts, drop it.

Steps 2 and 3 take locks that the ledger's statements wait behind, for as long as the step
waits for the transactions in progress: at most ``LOCK_TIMEOUT``, after which the step gives up
and a later pass tries again. Several replicas may sweep at once: each step holds a transaction
advisory lock and re-reads what the last one left.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence

import asyncpg

from .._exceptions import ConfigurationError
from . import migrations
from .base import Connection, Row, Store
from .queries import layout_queries

logger = logging.getLogger("receiver.sweeper")

#: Seconds a partition stays the current one before the sweep opens the next.
SPAN = 24 * 3600.0

#: How long a step that locks the ledger (closing or dropping a partition) waits for the
#: transactions in progress before it gives up until the next pass.
LOCK_TIMEOUT = "1s"

LAYOUTS = ("single", "partitioned")

# A column's or an index's name, as the conversions write it into DDL.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


async def layout(conn: Connection) -> str | None:
    """``"single"`` or ``"partitioned"``; None where the ledger's tables are not there.
    SQLite has the single table only."""
    if conn.dialect == "sqlite":
        return "single"
    row = await conn.fetchrow(layout_queries()["layout"])
    if row is None:
        return None
    return "partitioned" if row["partitioned"] else "single"


async def convert(conn: Connection, target: str) -> bool:
    """Bring the ledger to the ``target`` layout; False if it is already there. The schema's
    migrations must all be applied first. One transaction: the receipts table is locked while
    it runs (on a large ledger, minutes: the keys are copied, or every receipt is)."""
    if target not in LAYOUTS:
        raise ConfigurationError(f"the layout is one of {', '.join(LAYOUTS)}, not {target!r}")
    if conn.dialect != "postgresql":
        raise ConfigurationError("only a PostgreSQL ledger has layouts; SQLite has one table")
    async with conn.transaction():
        await conn.fetchval(layout_queries()["migration_lock"])
        missing = (await migrations.status(conn)).missing
        if missing:
            raise ConfigurationError(
                f"apply the migrations first ({', '.join(m.label for m in missing)} missing): "
                "receiver migrate"
            )
        current = await layout(conn)
        if current == target:
            return False
        await conn.execute(layout_queries()["lock_receipts"])
        indexes = await conn.fetch(layout_queries()["receipts_indexes"])
        if not all(_IDENTIFIER.fullmatch(index["name"]) for index in indexes):
            raise ConfigurationError("receiver_receipts has an index receiver cannot name")
        if target == "partitioned":
            await _partition(conn, indexes)
        else:
            await _unpartition(conn, indexes)
    logger.info("the receipts table now has the %s layout", target)
    return True


async def _partition(conn: Connection, indexes: Sequence[Row]) -> None:
    """Partition 0 keeps the single table's indexes; the partitioned table gets the same ones
    (whatever the migrations made), by the same names."""
    await conn.execute(layout_queries()["partition"])
    for index in indexes:
        renamed = index["name"].replace("receiver_receipts_", "receiver_receipts_p0_", 1)
        await conn.execute(
            layout_queries()["rename_index"].format(name=index["name"], renamed=renamed)
        )
        await conn.execute(index["definition"])
    await conn.execute(layout_queries()["partition_keys"])


async def _unpartition(conn: Connection, indexes: Sequence[Row]) -> None:
    names = [r["name"] for r in await conn.fetch(layout_queries()["unpartition_columns"])]
    if not all(_IDENTIFIER.fullmatch(name) for name in names):
        raise ConfigurationError(f"receiver_receipts has a column receiver cannot name: {names}")
    await conn.execute(layout_queries()["unpartition"].format(columns=", ".join(names)))
    for index in indexes:
        await conn.execute(index["definition"].replace(" ON ONLY ", " ON ", 1))


async def expire(store: Store, now: float | None, retention: float, deadline: float) -> int:
    """One pass of expiry on a partitioned ledger: open a new partition if the current one's
    span is over, then drop the older ones whose receipts have all expired, until
    ``deadline`` (``time.monotonic()``). Expiry is judged at ``now`` (None: the database's
    clock), dead letters kept ``retention`` seconds past their window; the number of receipts
    dropped."""
    async with store.acquire() as conn:
        if now is None:
            now = float(await conn.fetchval(layout_queries()["database_now"]))
        buckets = await _rotate(conn, now)
    dropped = 0
    for bucket in buckets:
        if time.monotonic() >= deadline:
            break
        try:
            dropped += await _drop(store, bucket, now, retention)
        except asyncpg.exceptions.LockNotAvailableError:
            logger.info(
                "partition %s of receiver_receipts not dropped this pass: the ledger was busy "
                "for longer than %s; the next pass tries again",
                bucket,
                LOCK_TIMEOUT,
            )
    return dropped


async def _rotate(conn: Connection, now: float) -> list[int]:
    """Open the next partition if the current one's span is over (unless another replica's
    step holds the lock); the partitions older than the current one, oldest first."""
    async with conn.transaction():
        locked = await _locked(conn)
        rows = await conn.fetch(layout_queries()["partitions"], SPAN, now)
        buckets = [int(row["bucket"]) for row in rows]
        if locked and rows and rows[-1]["due"]:
            buckets.append(await _open_next(conn, buckets[-1], now))
    return buckets[:-1]


async def open_partition(store: Store, now: float | None = None) -> int:
    """Open the next partition, at ``now`` (None: the database's clock), whatever the current
    one's age (for operators and tests); its number."""
    async with store.acquire() as conn, conn.transaction():
        await conn.fetchval(layout_queries()["lock"])
        if now is None:
            now = float(await conn.fetchval(layout_queries()["database_now"]))
        rows = await conn.fetch(layout_queries()["partitions"], SPAN, now)
        return await _open_next(conn, int(rows[-1]["bucket"]), now)


async def _open_next(conn: Connection, current: int, now: float) -> int:
    """Under the partition lock: open the partition after ``current``; its number."""
    bucket = current + 1
    await conn.fetchval(layout_queries()["open_partition"], bucket, now)
    logger.info("opened partition %s of receiver_receipts", bucket)
    return bucket


async def _drop(store: Store, bucket: int, now: float, retention: float) -> int:
    async with store.acquire() as conn:
        row = await conn.fetchrow(layout_queries()["still_open"], bucket, now)
        if row is None or row["open"]:
            return 0
        if not await move_kept(conn, bucket, now, retention):
            return 0
        if not await close(conn, bucket, now, retention):
            return 0
        return await finish(conn, bucket, now, retention)


async def move_kept(conn: Connection, bucket: int, now: float, retention: float) -> bool:
    """Step 1: move what expiry keeps out of partition ``bucket`` (row locks only). False if
    another replica's step runs, or the partition is gone."""
    async with conn.transaction():
        if not await _present(conn, bucket):
            return False
        await _move(conn, bucket, now, retention)
    return True


async def close(conn: Connection, bucket: int, now: float, retention: float) -> bool:
    """Step 2: from now on, every row of partition ``bucket`` stays expired as of ``now``."""
    async with conn.transaction():
        if not await _present(conn, bucket):
            return False
        await conn.fetchval(layout_queries()["lock_timeout"], LOCK_TIMEOUT)
        await conn.fetchval(layout_queries()["close_partition"], bucket, now, retention)
    return True


async def finish(conn: Connection, bucket: int, now: float, retention: float) -> int:
    """Step 3: move what was revived before the close, then drop the partition with its keys
    and attempts; the number of receipts dropped."""
    async with conn.transaction():
        if not await _present(conn, bucket):
            return 0
        await conn.fetchval(layout_queries()["lock_timeout"], LOCK_TIMEOUT)
        await _move(conn, bucket, now, retention)
        gone = int(await conn.fetchval(layout_queries()["drop_partition"], bucket))
    logger.info("dropped partition %s of receiver_receipts: %d expired receipts", bucket, gone)
    return gone


async def _locked(conn: Connection) -> bool:
    """This transaction holds the sweep's partition lock (another replica's step is not
    running)."""
    return bool(await conn.fetchval(layout_queries()["try_lock"]))


async def _present(conn: Connection, bucket: int) -> bool:
    """Under the partition lock: partition ``bucket`` is still there (no other replica dropped
    it meanwhile)."""
    return await _locked(conn) and bool(await conn.fetchval(layout_queries()["present"], bucket))


async def _move(conn: Connection, bucket: int, now: float, retention: float) -> None:
    """In the caller's transaction: the receipts expiry keeps leave partition ``bucket``, their
    keys with them (the claim trigger follows a receipt while receiver.moving is on)."""
    await conn.fetchval(layout_queries()["moving"], "on")
    await conn.execute(layout_queries()["move_kept"], bucket, now, retention)
    await conn.fetchval(layout_queries()["moving"], "off")
