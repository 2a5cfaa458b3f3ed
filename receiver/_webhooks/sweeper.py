"""The Receiver's sweeper pass: stale webhook receipts recovered exactly as a redelivery
would recover them, through the pipeline (transactional handlers run again under the next
fence; external ones are reconciled or marked failed), on top of the shared pass of
receiver/_ops/sweeper.py (stale keys of the other entry points, expired rows).
"""

from __future__ import annotations

from collections.abc import Mapping

from .._ledger import receipts as ledger
from .._ledger.receipts import Receipt
from .._ledger.responses import stored_error
from .._logging import get_logger
from .._ops import sweeper as shared
from .._ops.review import needs_review
from .._ops.sweeper import Recoverer, SweepReport, WebhookRecoverer
from .._store.base import Store
from .outcomes import Outcome
from .pipeline import Pipeline
from .providers import Provider

logger = get_logger("receiver.sweeper")


async def sweep(
    store: Store,
    pipeline: Pipeline | None,
    providers: Mapping[str, Provider],
    *,
    now: float | None,
    batch: int = 100,
    max_batches: int = 10,
    delete_batch: int = shared.DELETE_BATCH,
    budget: float = shared.DELETE_BUDGET,
    retention: float = shared.DEAD_LETTER_RETENTION,
    audit_retention: float = shared.AUDIT_RETENTION,
    recoverers: Mapping[str, Recoverer] | None = None,
) -> SweepReport:
    """One pass of :func:`receiver._ops.sweeper.sweep` (same options) that recovers stale
    webhook receipts through ``pipeline``; without a ``pipeline`` they are left to the
    Receiver that owns their handlers."""
    webhooks = None if pipeline is None else recoverer(store, pipeline, providers)
    return await shared.sweep(
        store,
        webhooks,
        now=now,
        batch=batch,
        max_batches=max_batches,
        delete_batch=delete_batch,
        budget=budget,
        retention=retention,
        audit_retention=audit_retention,
        recoverers=recoverers,
    )


def recoverer(
    store: Store, pipeline: Pipeline, providers: Mapping[str, Provider]
) -> WebhookRecoverer:
    """Recovers one stale webhook receipt through ``pipeline``; counted in its metrics."""

    async def recover(receipt: Receipt, now: float | None) -> str:
        key = receipt.key
        provider = providers.get(key.provider)
        if provider is None:
            took = await _fail(
                store, pipeline, receipt, now, "its provider is no longer configured"
            )
            return _count(pipeline, key.provider, "failed" if took else "skipped")
        reply = await pipeline.recover(provider, receipt)
        if reply is None or reply.outcome in (Outcome.IN_FLIGHT, Outcome.LEASE_LOST):
            return _count(pipeline, key.provider, "skipped")
        if reply.outcome is Outcome.HANDLER_FAILED:
            result = _count(pipeline, key.provider, "released")
        elif reply.outcome is Outcome.NEEDS_REVIEW:
            result = _count(pipeline, key.provider, "failed")
        else:
            result = _count(pipeline, key.provider, "recovered")
        logger.warning(
            "stale receipt swept: %s",
            reply.outcome.value,
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": reply.fence},
        )
        return result

    return recover


def _count(pipeline: Pipeline, provider: str, result: str) -> str:
    if pipeline.metrics is not None:
        pipeline.metrics.swept(provider, result)
    return result


async def _fail(
    store: Store, pipeline: Pipeline, receipt: Receipt, now: float | None, reason: str
) -> bool:
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
        answer = stored_error(422, "unrecoverable", reason)
        await needs_review(conn, receipt.key, fence, answer, reason, now, pipeline.metrics)
        return True
