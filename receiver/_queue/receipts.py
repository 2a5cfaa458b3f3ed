"""The ledger's statements for queued receipts (docs/how-to/queued.md).

A queued delivery is recorded at ingest in state ``queued``, due now, with its raw body and the
sender's answer (``202 {"status":"queued"}``) already stored: that answer is what every
redelivery gets, whatever the processing state, and no statement here overwrites it. A worker
takes due receipts in flight with the next fence and a lease (:func:`fetch`), runs the handlers
in one transaction with the fenced completion (:func:`complete`), or, after a failure, makes
the receipt due again later or, after the last attempt, failed (:func:`retry`). Every
operation is one statement decided by the database, as in :mod:`receiver._ledger.receipts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._exceptions import LeaseLost
from .._ledger.batcher import Batcher
from .._ledger.receipts import Claim, Key, State, StoredResponse
from .._store.base import Connection, Row, Store
from .backoff import Backoff

#: The sender's answer to a queued delivery, stored at ingest and replayed byte for byte.
QUEUED = StoredResponse(202, "application/json", b'{"status":"queued"}')


@dataclass(frozen=True, slots=True)
class Queued:
    """What the pipeline needs to finish a queued receipt a worker claimed: how many attempts
    failed before this one, the provider's retry schedule, and the dedup window that starts
    when the receipt is finished."""

    failed: int
    backoff: Backoff
    window: float


async def enqueue(conn: Connection, claims: Sequence[Claim], now: float | None) -> dict[Key, bool]:
    """Insert every claim as a queued receipt; the keys inserted now, each with its key drift
    (a key already in the ledger, or twice in ``claims``, is inserted once at most).
    PostgreSQL: one statement for the whole batch and at most one NOTIFY; SQLite: one
    statement each, in one transaction and one call to its thread."""
    if not claims:
        return {}
    if conn.dialect == "postgresql":
        rows = await conn.run_all(
            "enqueue",
            [c.key.provider for c in claims],
            [c.key.webhook_id for c in claims],
            [c.payload_hash for c in claims],
            [c.event_type for c in claims],
            [c.body for c in claims],
            now,
            QUEUED.status,
            QUEUED.content_type,
            QUEUED.body,
        )
        # The row of NULLs says the batch notified the workers.
        return {
            Key(r["provider"], r["webhook_id"]): bool(r["drift"])
            for r in rows
            if r["provider"] is not None
        }
    async with conn.transaction():
        rows = await conn.run_many(
            "enqueue",
            [
                (
                    c.key.provider,
                    c.key.webhook_id,
                    c.payload_hash,
                    c.event_type,
                    c.body,
                    now,
                    QUEUED.status,
                    QUEUED.content_type,
                    QUEUED.body,
                )
                for c in claims
            ],
        )
    return {Key(r["provider"], r["webhook_id"]): bool(r["drift"]) for r in rows}


async def fetch(conn: Connection, now: float | None, limit: int, lease: float) -> list[Row]:
    """Take up to ``limit`` due receipts in flight with the next fence and a lease of ``lease``
    seconds (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so workers never take the same one)."""
    return await conn.run_all("queue_fetch", now, limit, lease)


async def complete(
    conn: Connection, key: Key, fence: int, state: State, now: float | None, window: float
) -> None:
    """Finish a queued receipt under ``fence`` (keeping the stored 202); LeaseLost if a newer
    attempt owns it, so that the caller's transaction rolls back."""
    row = await conn.run(
        "queue_complete", key.provider, key.webhook_id, fence, state.value, now, window
    )
    if row is None:
        raise LeaseLost(f"fence {fence} of {key.provider}/{key.webhook_id} is stale")


async def retry(
    conn: Connection,
    key: Key,
    fence: int,
    error: str,
    now: float | None,
    *,
    delay: float,
    dead: bool,
    window: float,
) -> bool:
    """A failed attempt: due again in ``delay`` seconds, or failed if ``dead``; the error is
    kept with the attempt's fence. False if the fence is stale (nothing changed)."""
    async with conn.transaction():
        row = await conn.run(
            "queue_retry", key.provider, key.webhook_id, fence, error, now, delay, dead, window
        )
        if row is None:
            return False
        await conn.run("record_attempt", key.provider, key.webhook_id, fence, now, error)
        return True


#: The kind of error a receipt keeps when its handlers answered a final 4xx its sender never
#: saw, answered 202 before they finished (see :func:`reject`).
REJECTED = "HandlerRejected"
_REJECTED_PREFIX = f"{REJECTED}: the handler answered "


def rejection(status: int, when: str = "queued") -> str:
    """The error kept for a receipt whose handlers answered ``status`` (a final 4xx) after
    its sender was answered 202, when the delivery was ``when`` (queued, or handed off)."""
    return (
        f"{_REJECTED_PREFIX}{status}, a final answer: not retried (its sender was answered "
        f"202 when the delivery was {when})"
    )


def rejected_status(state: State | str, last_error: str | None) -> int | None:
    """The status a failed receipt's handlers answered when they rejected it after its sender
    was answered 202; None if they did not (a dead letter, a receipt that needs review, any
    other state)."""
    if state != State.FAILED or not last_error or not last_error.startswith(_REJECTED_PREFIX):
        return None
    digits = last_error[len(_REJECTED_PREFIX) :].partition(",")[0]
    return int(digits) if digits.isdigit() else None


async def reject(
    conn: Connection, key: Key, fence: int, error: str, now: float | None, window: float
) -> None:
    """Fail a queued receipt for good under ``fence`` and in the caller's transaction (the one
    of the handlers' writes, which commit with it, as an inline final answer's do), with no
    retry and ``error`` as the attempt's error: its handlers answered a final 4xx
    (:func:`rejection`), or its body cannot be run. The stored 202 is kept for every
    redelivery, and the body for a replay. LeaseLost if a newer attempt owns it, so that the
    caller's transaction rolls back."""
    row = await conn.run(
        "queue_retry", key.provider, key.webhook_id, fence, error, now, 0.0, True, window
    )
    if row is None:
        raise LeaseLost(f"fence {fence} of {key.provider}/{key.webhook_id} is stale")
    await conn.run("record_attempt", key.provider, key.webhook_id, fence, now, error)


async def reclaim(conn: Connection, claim: Claim, seen_fence: int) -> int | None:
    """Take over a queued receipt whose worker died or stalled (lease expired); the next fence,
    or None if another attempt took it first."""
    k = claim.key
    row = await conn.run(
        "queue_reclaim", k.provider, k.webhook_id, seen_fence, claim.now, claim.lease
    )
    return None if row is None else int(row["fence"])


async def requeue(conn: Connection, claim: Claim, seen_fence: int) -> bool:
    """Queue a delivery again over its key's expired (or released) receipt, fenced."""
    k = claim.key
    row = await conn.run(
        "queue_requeue",
        k.provider,
        k.webhook_id,
        seen_fence,
        claim.payload_hash,
        claim.event_type,
        claim.body,
        claim.now,
        QUEUED.status,
        QUEUED.content_type,
        QUEUED.body,
    )
    return row is not None


async def reopen(conn: Connection, key: Key, fence: int, now: float | None) -> bool:
    """Dead-letter replay of a failed queued receipt: due now with a fresh round of attempts.
    False if it is not a failed queued receipt with this fence."""
    row = await conn.run("queue_reopen", key.provider, key.webhook_id, fence, now)
    return row is not None


async def stale(conn: Connection, now: float | None, limit: int) -> list[Row]:
    """Queued receipts in flight whose lease ran out: their worker died or stalled."""
    return await conn.run_all("queue_stale", now, limit)


async def next_due(conn: Connection, now: float | None) -> float | None:
    """Seconds until the earliest queued receipt is due (0 if one is due); None if none is."""
    row = await conn.run("queue_next_due", now)
    wait = None if row is None else row["wait"]
    return None if wait is None else max(0.0, float(wait))


async def depth(conn: Connection, now: float | None) -> list[Row]:
    """Per provider: receipts due now, waiting for a retry, and the oldest due one's due_at."""
    return await conn.run_all("queue_depth", now)


async def release(conn: Connection, key: Key, fence: int, now: float | None) -> bool:
    """A worker stopping gives back an attempt it cancelled (its transaction rolled back): due
    again now, not counted as a failed attempt. False if the fence is stale."""
    row = await conn.run("queue_release", key.provider, key.webhook_id, fence, now)
    return row is not None


@dataclass(frozen=True, slots=True)
class Done:
    """One fenced completion of a queued receipt, for :func:`complete_many`."""

    key: Key
    fence: int
    state: State
    window: float


async def complete_many(conn: Connection, items: Sequence[Done], now: float | None) -> list[bool]:
    """Finish many queued receipts at once, as
    :func:`receiver._ledger.receipts.complete_many` completes
    inline ones (the keyed statement per item, pipelined or in one transaction); per item,
    False if its fence was stale."""
    args = [
        (d.key.provider, d.key.webhook_id, d.fence, d.state.value, now, d.window) for d in items
    ]
    if conn.dialect == "postgresql":
        rows = await conn.run_many("queue_complete", args)
    else:
        async with conn.transaction():
            rows = await conn.run_many("queue_complete", args)
    done = {(r["provider"], r["webhook_id"], r["fence"]) for r in rows}
    return [(d.key.provider, d.key.webhook_id, d.fence) in done for d in items]


class Completions:
    """The completions of queued receipts whose handlers never touched ``tx``: one statement
    each, or, where the store batches (receiver/_ledger/batcher.py), one place in a shared
    statement,
    as the inline path's completions are."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._batcher: Batcher[Done, bool] | None = None
        if store.batch_flushes:
            self._batcher = Batcher(self._flush, max_in_flight=store.batch_flushes)

    async def complete(self, key: Key, fence: int, state: State, window: float) -> None:
        """LeaseLost if ``fence`` is stale (a newer attempt owns the receipt)."""
        if self._batcher is None:
            async with self.store.acquire() as conn:
                await complete(conn, key, fence, state, self.store.now(), window)
            return
        if not await self._batcher.submit(Done(key, fence, state, window)):
            raise LeaseLost(f"fence {fence} of {key.provider}/{key.webhook_id} is stale")

    async def _flush(self, items: Sequence[Done]) -> Sequence[bool | BaseException]:
        async with self.store.acquire() as conn:
            return await complete_many(conn, items, self.store.now())
