"""The sweeper: nothing stays in flight forever (I6), and expired receipts go away.

One pass (:func:`sweep`) recovers stale in-flight receipts that nobody redelivers, exactly as a
redelivery would, through their owner (a Receiver's pipeline for webhook receipts,
receiver/_webhooks/sweeper.py; the executor's recovery for actions; a release for the
middleware's keys), then deletes expired receipts in batches until the backlog is gone
or the pass's time budget is spent. Passes are safe to run concurrently from several replicas:
every takeover is a compare-and-set on the fence, and on PostgreSQL each deletion batch skips
the rows another sweeper has locked, so replicas add capacity instead of queueing.

Expiry by state: a completed receipt is deleted when its window ends; a dead letter (failed, or
released after a failed attempt) is kept for ``retention`` after its window, as evidence for an
operator; an in-flight receipt is never deleted (it is recovered first, like any stale one).
The console's audit records (operator actions) are kept for ``audit_retention`` after they
were taken, then deleted by the same pass, in the same bounded batches, oldest first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from .._exceptions import StoreMisconfigured, StoreUnavailable
from .._ledger import keyed
from .._ledger.receipts import Key, Receipt
from .._logging import get_logger
from .._store import partitions
from .._store.base import Row, Store
from .._values import count
from .._values import seconds as checked_seconds
from .redact import describe, is_driver_error, stack

logger = get_logger("receiver.sweeper")

#: How long a dead letter (failed, or released after a failed attempt) outlives its window,
#: by default (``dead_letter_retention``).
DEAD_LETTER_RETENTION = 7 * 24 * 3600.0

#: How long an audit record of an operator action is kept, by default (``audit_retention``).
AUDIT_RETENTION = 365 * 24 * 3600.0

#: Rows per deletion batch: one statement, one short transaction (a few tens of milliseconds).
DELETE_BATCH = 5000

#: Seconds one pass may spend deleting before it leaves the rest to the next pass.
DELETE_BUDGET = 30.0

#: Recovers a stale claim of a key that is not a webhook-id (an agent action): one of the
#: ``result`` values of the stale leases metric.
Recoverer = Callable[[Receipt], Awaitable[str]]

#: Recovers a stale webhook receipt, judged at ``now``, through the handlers of the Receiver
#: that owns it (receiver/_webhooks/sweeper.py): one of the same ``result`` values.
WebhookRecoverer = Callable[[Receipt, float | None], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one pass did."""

    recovered: int = 0  # stale receipts completed (run again or reconciled)
    failed: int = 0  # stale receipts marked failed (an alert was logged for each)
    released: int = 0  # stale receipts whose recovery failed again: released for a retry
    skipped: int = 0  # taken over by someone else first
    deleted: int = 0  # expired receipts deleted
    audit_deleted: int = 0  # audit records older than the audit retention deleted


def check_retention(name: str, seconds: float) -> float:
    """A retention option: seconds from zero (nothing kept beyond its time) to two years, as
    in a configuration file; PostgreSQL's timestamps overflowed on every sweep past that."""
    return checked_seconds(name, seconds, zero=True)


async def sweep(
    store: Store,
    webhooks: WebhookRecoverer | None,
    *,
    now: float | None,
    batch: int = 100,
    max_batches: int = 10,
    delete_batch: int = DELETE_BATCH,
    budget: float = DELETE_BUDGET,
    retention: float = DEAD_LETTER_RETENTION,
    audit_retention: float = AUDIT_RETENTION,
    recoverers: Mapping[str, Recoverer] | None = None,
) -> SweepReport:
    """One pass: recover stale in-flight receipts (``batch`` at a time, up to ``max_batches``
    batches), then delete expired ones and audit records older than ``audit_retention``
    (``delete_batch`` at a time) for at most ``budget`` seconds. Expiry and leases are
    judged at ``now`` (the statements take None as the database's own clock).

    Stale webhook receipts go to ``webhooks``; without it (an app that has only the action
    executor or the Idempotency-Key middleware) they are left to the Receiver that owns their
    handlers.
    """
    batch = count("batch", batch)
    deadline = time.monotonic() + budget
    tally: collections.Counter[str] = collections.Counter()
    for _ in range(max_batches):
        async with store.acquire() as conn:
            rows = await conn.run_all("stale", now, batch)
        skipped = tally["skipped"]
        await _recover(store, webhooks, rows, now, tally, recoverers or {})
        # A batch that was all taken over by others, or short, or late: the rest can wait.
        if len(rows) < batch or tally["skipped"] - skipped == len(rows):
            break
        if time.monotonic() >= deadline:
            break
    deleted = await _delete_expired(store, now, retention, delete_batch, deadline)
    audit = await _delete_old_audit(store, now, audit_retention, delete_batch, deadline)
    return SweepReport(
        tally["recovered"], tally["failed"], tally["released"], tally["skipped"], deleted, audit
    )


async def _recover(
    store: Store,
    webhooks: WebhookRecoverer | None,
    rows: Sequence[Row],
    now: float | None,
    tally: collections.Counter[str],
    recoverers: Mapping[str, Recoverer],
) -> None:
    for row in rows:
        key = Key(row["provider"], row["webhook_id"])
        receipt = Receipt.from_row(key, row)
        namespace = keyed.namespace(key.provider)
        if namespace is not None:
            # An action or an Idempotency-Key request: its owner recovers it. Never marked
            # failed here, since an external action must not be judged without its reconcile.
            tally[await _recover_keyed(store, receipt, namespace, recoverers)] += 1
        elif webhooks is None:
            tally["skipped"] += 1  # a webhook receipt: its Receiver's sweeper recovers it
        else:
            tally[await webhooks(receipt, now)] += 1


async def _delete_expired(
    store: Store, now: float | None, retention: float, batch: int, deadline: float
) -> int:
    """Delete expired receipts, one batch per statement, until a batch comes back short (the
    backlog is done) or the deadline passes. Each batch commits on its own, so row locks are
    held for one batch only and deliveries never wait long behind the sweeper. A PostgreSQL
    ledger with the partitioned layout drops whole partitions instead (receiver/_store/
    partitions.py)."""
    if store.dialect == "postgresql":
        async with store.acquire() as conn:
            if await partitions.layout(conn) == "partitioned":
                return await partitions.expire(store, now, retention, deadline)
    deleted = await _delete_batches(store, "delete_expired", now, retention, batch, deadline)
    # Attempts whose receipt is gone: SQLite's batches leave them; PostgreSQL's take them along,
    # and there the anti-join would read the whole receipts table on every pass.
    while store.dialect == "sqlite" and time.monotonic() < deadline:
        async with store.acquire() as conn:
            orphans = await conn.run_all("delete_orphan_attempts", batch)
        if len(orphans) < batch:
            break
    return deleted


async def _delete_batches(
    store: Store, statement: str, now: float | None, keep: float, batch: int, deadline: float
) -> int:
    """Run a deletion ``statement`` (now, seconds kept, batch) until a batch comes back short
    or the deadline passes; how many rows it deleted."""
    deleted = 0
    while True:
        async with store.acquire() as conn:
            rows = await conn.run_all(statement, now, keep, batch)
        gone = sum(int(row["n"]) for row in rows)
        deleted += gone
        if gone < batch or time.monotonic() >= deadline:
            return deleted


# Stores whose role was found unable to delete audit records (warned once per process).
_NO_AUDIT_PRIVILEGE: set[str] = set()


async def _delete_old_audit(
    store: Store, now: float | None, keep: float, batch: int, deadline: float
) -> int:
    """Audit records older than ``keep``, and the bulk replays that ended before then (their
    keys, then the job: the audit record of each keeps its outcome counts until it goes too).
    A least-privilege application role has no rights on the console's tables
    (docs/how-to/postgresql.md): then the pass goes on without this part, and says once what
    to grant."""
    deleted = 0  # what went before a statement the role may not run still counts
    try:
        deleted = await _delete_batches(store, "delete_old_audit", now, keep, batch, deadline)
        for statement in ("delete_old_bulk_items", "delete_old_bulk_jobs"):
            await _delete_batches(store, statement, now, keep, batch, deadline)
        return deleted
    except StoreMisconfigured:
        if store.url not in _NO_AUDIT_PRIVILEGE:
            _NO_AUDIT_PRIVILEGE.add(store.url)
            logger.warning(
                "old audit records and bulk replays are not deleted: this role cannot delete "
                "from the console's tables (GRANT SELECT, DELETE ON receiver_audit, "
                "receiver_bulk_jobs, receiver_bulk_items to the role that sweeps, for "
                "audit_retention to apply)"
            )
        return deleted


async def _recover_keyed(
    store: Store, receipt: Receipt, namespace: str, recoverers: Mapping[str, Recoverer]
) -> str:
    recover = recoverers.get(namespace)
    if recover is not None:
        return await recover(receipt)
    if namespace == keyed.IDEMPOTENCY:
        # A request whose answer was never stored: give the key back, so that the client's
        # retry runs the endpoint again (receiver/_idempotency/middleware.py, "after a crash").
        released = await keyed.release(store, receipt.key, receipt.fence, "lease expired")
        return "released" if released else "skipped"
    return "skipped"


async def sweep_forever(
    run_once: Callable[[], Awaitable[object]], interval: float, *, jitter: float = 0.2
) -> None:
    """Run ``run_once`` every ``interval`` seconds (with jitter, so replicas spread out) until
    cancelled. A failing pass is logged and the loop goes on."""
    while True:
        await asyncio.sleep(interval * (1 + random.uniform(-jitter, jitter)))
        try:
            await run_once()
        except StoreUnavailable as exc:
            logger.warning("sweep skipped: store unavailable (%s)", exc)
        except Exception as exc:
            if is_driver_error(exc):  # its text may carry a receipt's values: never logged
                logger.error("sweep failed: %s\n%s", describe(exc), stack(exc))
            else:
                logger.exception("sweep failed")


class KeySweeper:
    """The sweeper of an app that has no Receiver: the action executor's or the Idempotency-Key
    middleware's. Every ``interval`` seconds it recovers their stale keys (through
    ``recoverers``, by namespace; the middleware's are released for the client's retry) and
    deletes expired receipts, as the Receiver's sweeper does. Webhook receipts in the same
    ledger are left to their Receiver."""

    def __init__(
        self,
        store: Store,
        recoverers: Mapping[str, Recoverer],
        interval: float | None,
        *,
        retention: float = DEAD_LETTER_RETENTION,
        audit_retention: float = AUDIT_RETENTION,
    ) -> None:
        self.store = store
        self.recoverers = recoverers
        self.interval = interval
        self.retention = check_retention("dead_letter_retention", retention)
        self.audit_retention = check_retention("audit_retention", audit_retention)
        self._task: asyncio.Task[None] | None = None

    async def run_once(self, *, batch: int = 100) -> SweepReport:
        return await sweep(
            self.store,
            None,
            now=self.store.now(),
            batch=batch,
            retention=self.retention,
            audit_retention=self.audit_retention,
            recoverers=self.recoverers,
        )

    def start(self) -> None:
        """Start the background passes (idempotent; nothing when ``interval`` is None)."""
        if self.interval is not None and self._task is None:
            self._task = asyncio.create_task(sweep_forever(self.run_once, self.interval))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
