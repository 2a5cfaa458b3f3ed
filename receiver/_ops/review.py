"""Needs review: a receipt that cannot be finished safely by the receiver alone (an external
handler interrupted with no ``reconcile``, a stale receipt whose provider is gone) is marked
failed for a person to decide.

Every path to it goes through :func:`needs_review`, so that each leaves the same trace: the
final answer stored (fenced), the reason in ``last_error`` and as an attempt (so ``receiver
failed`` shows it with attempts > 0), an ``ALERT`` log line, and one increment of
``receiver_needs_review_total``, the series the ``ReceiverNeedsReview`` alert reads.
"""

from __future__ import annotations

import logging

from .._ledger import receipts as ledger
from .._ledger.receipts import Key, State, StoredResponse
from .._store.base import Connection
from .metrics import Metrics

logger = logging.getLogger("receiver")


async def needs_review(
    conn: Connection,
    key: Key,
    fence: int,
    answer: StoredResponse,
    reason: str,
    now: float | None,
    metrics: Metrics | None,
) -> None:
    """Store ``answer`` as the final one under ``fence`` and keep ``reason``; raises LeaseLost
    (nothing changed) if a newer claim owns the key."""
    await record_review(conn, key, fence, answer, reason, now)
    logger.error(
        "ALERT: receipt needs review: %s",
        reason,
        extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
    )
    if metrics is not None:
        metrics.needs_review(key.provider)


async def record_review(
    conn: Connection, key: Key, fence: int, answer: StoredResponse, reason: str, now: float | None
) -> None:
    """The ledger's part of :func:`needs_review` (no alert): the final answer, the reason in
    ``last_error`` and an attempt row, in one transaction."""
    async with conn.transaction():
        await ledger.complete(conn, key, fence, answer, now, state=State.FAILED)
        await conn.run("note_failure", key.provider, key.webhook_id, fence, reason)
        await conn.run("record_attempt", key.provider, key.webhook_id, fence, now, reason)
