"""A stored delivery run again: the sweeper's recovery of a stale in-flight receipt, a
worker's of a queued one, an operator's replay, and the reconcile path of handlers with
external effects (never re-run blindly: each one's reconcile() asks the outside world what
happened)."""

from __future__ import annotations

from .._ledger import receipts as ledger
from .._ledger.receipts import Receipt
from .._ledger.responses import encode, error
from .._ledger.results import NotStorable, RunAgain
from .._logging import get_logger
from .._ops.redact import describe
from .._queue import receipts as queue
from .execution import Execution
from .jobs import Job, event_for, has_external
from .outcomes import Outcome, Reply
from .providers import Provider

logger = get_logger("receiver")


class Recovery:
    """Runs stored deliveries again through the steps of ``steps`` (the receiver's pipeline)."""

    def __init__(self, steps: Execution) -> None:
        self.steps = steps

    async def recover(
        self,
        provider: Provider,
        receipt: Receipt,
        *,
        reconcile: bool = True,
        queued: queue.Queued | None = None,
    ) -> Reply | None:
        """Run a stored delivery again under the next fence, as a redelivery would: the
        sweeper's recovery of a stale in-flight receipt (external handlers are reconciled,
        never re-run blindly; an operator's replay of one is reconciled too), or with
        ``reconcile=False`` an operator's dead-letter replay of a released or reopened receipt
        (external handlers run again too: the operator asked). None if another attempt took the
        receipt over first, or if this process is still running it (its lease ran out, but the
        attempt is alive)."""
        running = self.steps._running.get(receipt.key)
        if running is not None and running.lease_until > self.steps.clock():
            return None
        # The body is kept until completion, and the type as claimed (from the body or, for
        # GitHub-like schemes, from a header), so the job is rebuilt exactly; only the headers
        # of the original request are not kept.
        job = self.steps._prepare(
            provider,
            receipt.key.webhook_id,
            receipt.request_body or b"",
            receipt.event_type,
            self.steps.clock(),
        )
        job.queued = (
            queued  # a worker's recovery of a queued receipt (receiver/_webhooks/worker.py)
        )
        if reconcile and has_external(job.handlers):
            return await self.external(job, receipt)
        async with self.steps.store.acquire() as conn:
            fence = await self.steps._reclaim(conn, job, receipt.fence)
        if fence is None:
            return None
        return await self.steps._run(job, fence)

    async def external(self, job: Job, receipt: Receipt) -> Reply:
        """An attempt with external effects died or stalled. Never re-run it blindly: each
        external handler's reconcile() asks the outside world what happened."""
        key = job.claim.key
        async with self.steps.store.acquire() as conn:
            fence = await self.steps._reclaim(conn, job, receipt.fence)
        if fence is None:
            return self.steps._in_flight(receipt)
        externals = [h for h in job.handlers if h.effects == "external"]
        if any(h.reconcile is None for h in externals):
            reason = (
                "an attempt of an external handler without reconcile() was interrupted: it may "
                "or may not have acted; check the outside system, then `receiver replay`"
            )
            return await self.steps._mark_for_review(job, fence, reason)
        async with self.steps.store.lazy() as conn:
            event = event_for(job, fence, self.steps._extender(conn, key, fence))
            try:
                results = [await h.reconcile(event) for h in externals if h.reconcile is not None]
            except Exception as exc:
                failure: Exception | None = exc
            else:
                failure = None
        if failure is not None:
            return await self._reconcile_failed(job, fence, failure)
        if any(isinstance(r, RunAgain) for r in results):
            return await self.steps._run(job, fence)
        # The external effects happened; the transactional handlers' writes died with the
        # interrupted transaction, so they run again, and the reconciled answer is stored.
        answer = next((r for r in reversed(results) if r is not None), None)
        try:
            reconciled = encode(answer, self.steps.encoder)
        except NotStorable as exc:
            reason = (
                f"reconcile() returned a {exc.type_name}, which cannot be stored; check the "
                "outside system, then `receiver replay`"
            )
            return await self.steps._mark_for_review(job, fence, reason)
        transactional = [h for h in job.handlers if h.effects == "transactional"]
        return await self.steps._run(job, fence, handlers=transactional, answer=reconciled)

    async def _reconcile_failed(self, job: Job, fence: int, exc: Exception) -> Reply:
        """reconcile() itself failed: what happened outside is still unknown. The claim must
        not be released (a release lets the retry call the external handler again): it stays in
        flight with its lease ended, so that the next attempt, or the sweeper, reconciles again.
        """
        key = job.claim.key
        message = f"reconcile: {describe(exc)}"
        logger.error(
            "reconcile failed; the delivery stays unresolved until it is reconciled (%s)",
            type(exc).__name__,
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
        )
        async with self.steps.store.acquire() as conn:
            await ledger.unresolved(conn, key, fence, message, self.steps.store.now())
        response = error(500, "handler_failed", "reconciling the delivery failed; retry later")
        return Reply(response, Outcome.HANDLER_FAILED, fence)
