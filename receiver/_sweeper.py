"""The sweeper: nothing stays in flight forever (I6), and expired receipts go away.

One pass (:func:`sweep`) recovers stale in-flight receipts that nobody redelivers, exactly as a
redelivery would (transactional handlers run again under the next fence; external ones are
reconciled or marked failed), then deletes expired receipts in bounded batches. Passes are safe
to run concurrently from several replicas: every takeover is a compare-and-set on the fence, and
deleting a row twice deletes it once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from . import _ledger as ledger
from ._exceptions import StoreUnavailable
from ._ledger import Key, Receipt, State
from ._logging import get_logger
from ._pipeline import Outcome, Pipeline
from ._providers import Provider
from ._responses import stored_error
from ._store import Store

logger = get_logger("receiver.sweeper")


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one pass did."""

    recovered: int = 0  # stale receipts completed (run again or reconciled)
    failed: int = 0  # stale receipts marked failed (an alert was logged for each)
    released: int = 0  # stale receipts whose recovery failed again: released for a retry
    skipped: int = 0  # taken over by someone else first
    deleted: int = 0  # expired receipts deleted


async def sweep(
    store: Store,
    pipeline: Pipeline,
    providers: Mapping[str, Provider],
    *,
    now: float | None,
    batch: int = 100,
    max_batches: int = 10,
) -> SweepReport:
    recovered = failed = released = skipped = deleted = 0
    async with store.acquire() as conn:
        rows = await conn.run_all("stale", now, batch)
    for row in rows:
        key = Key(row["provider"], row["webhook_id"])
        receipt = Receipt.from_row(key, row)
        provider = providers.get(key.provider)
        if provider is None:
            if await _fail(store, receipt, now, "its provider is no longer configured"):
                failed += 1
                _count(pipeline, key.provider, "failed")
            else:
                skipped += 1
                _count(pipeline, key.provider, "skipped")
            continue
        reply = await pipeline.recover(provider, receipt)
        if reply is None or reply.outcome in (Outcome.IN_FLIGHT, Outcome.LEASE_LOST):
            skipped += 1
            _count(pipeline, key.provider, "skipped")
            continue
        if reply.outcome is Outcome.HANDLER_FAILED:
            released += 1
            _count(pipeline, key.provider, "released")
        elif reply.outcome is Outcome.NEEDS_REVIEW:
            failed += 1
            _count(pipeline, key.provider, "failed")
        else:
            recovered += 1
            _count(pipeline, key.provider, "recovered")
        logger.warning(
            "stale receipt swept: %s",
            reply.outcome.value,
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": reply.fence},
        )
    for _ in range(max_batches):
        async with store.acquire() as conn, conn.transaction():
            gone = await conn.run_all("delete_expired", now, batch)
            await conn.run_all("delete_orphan_attempts", batch * 10)
        deleted += len(gone)
        if len(gone) < batch:
            break
    return SweepReport(recovered, failed, released, skipped, deleted)


def _count(pipeline: Pipeline, provider: str, result: str) -> None:
    if pipeline.metrics is not None:
        pipeline.metrics.swept(provider, result)


async def _fail(store: Store, receipt: Receipt, now: float | None, reason: str) -> bool:
    """Mark a stale receipt failed under the next fence; False if someone else took it."""
    async with store.acquire() as conn:
        claim = ledger.Claim(
            receipt.key,
            receipt.payload_hash,
            receipt.event_type,
            receipt.request_body or b"",
            now,
            60.0,
            max(60.0, receipt.expires_at - receipt.now),
        )
        fence = await ledger.reclaim(conn, claim, receipt.fence)
        if fence is None:
            return False
        logger.error(
            "ALERT: stale receipt marked failed: %s",
            reason,
            extra={"provider": receipt.key.provider, "webhook_id": receipt.key.webhook_id},
        )
        answer = stored_error(422, "unrecoverable", reason)
        await ledger.complete(conn, receipt.key, fence, answer, now, state=State.FAILED)
        return True


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
        except Exception:
            logger.exception("sweep failed")
