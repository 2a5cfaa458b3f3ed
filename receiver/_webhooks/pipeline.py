"""One delivery, step by step: verify, parse, claim, decide, run, answer.

This module is the whole behaviour of docs/reference/http.md. The order is the
guarantee: nothing touches the store before verification passes (I5), and no handler runs
without a claim of its key (I1). Every delivery ends in one :class:`~.outcomes.Reply`: the
response and the :class:`~.outcomes.Outcome` that metrics and logs report.

The :class:`Pipeline` reads in the order a delivery meets it: the inline path (``deliver``),
the recovery of a stored delivery (``recover``, :mod:`.recovery`), the queued mode's two halves
(``process`` and ``process_together``, whose group transactions are :mod:`.groups`; and
``_enqueue``), then the inline claim. The steps they share (run, complete or give back) are
:mod:`.execution`. What a delivery is between steps is :mod:`.jobs`; how it ends is
:mod:`.outcomes`.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence

from starlette.datastructures import Headers
from starlette.responses import Response

from .._exceptions import StoreUnavailable, VerificationError
from .._ledger import receipts as ledger
from .._ledger.cache import ReplayCache
from .._ledger.receipts import Decision, Key, Receipt, State
from .._ledger.responses import error, replay
from .._ledger.results import Encoder
from .._logging import get_logger
from .._ops.metrics import Metrics
from .._queue import receipts as queue
from .._store.base import Store
from . import resent
from .execution import Execution
from .groups import Groups, QueuedAttempt
from .handlers import Registry
from .handoff import Turn
from .hints import Hints
from .jobs import Job, has_external, queued_mode
from .legacy import LegacyKeys
from .outcomes import Outcome, Reply, log_reply
from .providers import Provider
from .recovery import Recovery
from .tracing import annotate

logger = get_logger("receiver")


class Pipeline(Execution):
    """Processes deliveries for one Receiver (what its attempts share, and the steps after a
    claim: :class:`~.execution.Execution`)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        clock: Callable[[], float],
        retry_after: int,
        metrics: Metrics | None = None,
        cache: ReplayCache | None = None,
        encoder: Encoder | None = None,
    ) -> None:
        super().__init__(
            store,
            registry,
            clock=clock,
            retry_after=retry_after,
            metrics=metrics,
            cache=cache,
            encoder=encoder,
        )
        #: Stored deliveries run again: the sweeper's, the workers' and operators' replays.
        self.recovery = Recovery(self)
        #: Queued receipts run in group transactions (PostgreSQL workers).
        self.groups = Groups(self)
        #: The unsigned delivery ids seen per key, for key-drift alerts only.
        self.hints = Hints()
        #: Receipts stored under a scheme's earlier key (receiver/_webhooks/legacy.py).
        self.legacy = LegacyKeys(store)

    async def deliver(
        self,
        provider: Provider,
        headers: Headers,
        body: bytes,
        client: str | None = None,
        arrived: float | None = None,
        turn: Turn | None = None,
    ) -> Reply:
        """Verify, claim, run the handlers and answer one delivery. ``arrived``: when it
        arrived (``time.perf_counter()``), if it waited before this call; the duration the
        metrics and the log report starts there. ``turn``: a delivery that may be handed off
        at its sender's limit (:mod:`.handoff`)."""
        started = time.perf_counter() if arrived is None else arrived
        now = self.clock()
        try:
            verified = provider.verifier.verify(headers, body, now)
        except VerificationError as exc:
            reply = Reply(
                error(exc.status_code, exc.check, str(exc)), Outcome.REJECTED, detail=exc.check
            )
            self._report(provider.name, None, None, reply, started, headers)
            return reply
        # A completed receipt this process has seen is answered without a round trip, and the
        # usual redelivery, byte-identical, before its body is even parsed.
        key = Key(provider.name, verified.webhook_id)
        if verified.hint is not None and self.hints.changed(key, verified.hint):
            self._hint_drift(key)
        hit = None if self.cache is None else self.cache.get(key, now)
        if hit is not None and hit.body_hash == hashlib.sha256(body).digest():
            reply = Reply(replay(hit.response, replayed=True), Outcome.REPLAYED)
            reply = provider.stop_retries(reply)
            self._report(provider.name, key.webhook_id, hit.event_type, reply, started, headers)
            return reply
        job = self._prepare(
            provider,
            verified.webhook_id,
            body,
            verified.event_type,
            now,
            headers=headers,
            timestamp=verified.timestamp,
            client=client,
        )
        try:
            job = await self.legacy.rekey(provider, job)
        except StoreUnavailable as exc:
            reply = self._unavailable(exc)
            self._report(provider.name, key.webhook_id, None, reply, started, headers)
            return reply
        key = job.claim.key
        job.turn = turn
        queued = queued_mode(provider, job)
        running = None if queued else self._running.get(key)
        if running is not None and running.lease_until <= now:
            running = None  # stalled past its lease: the ledger decides, as for any attempt
        if hit is not None and hit.payload_hash == job.claim.payload_hash:
            reply = Reply(replay(hit.response, replayed=True), Outcome.REPLAYED)
        elif hit is not None:
            reply = self._mismatch(key)
        elif running is not None:
            # This process is running it now: the ledger would say the same, only later.
            if running.payload_hash != job.claim.payload_hash:
                reply = self._mismatch(key)
            else:
                wait = max(1, math.ceil(running.lease_until - now))
                reply = self._busy(running.fence, wait)
        else:
            try:
                reply = await (self._enqueue(job) if queued else self._claim_and_run(provider, job))
            except StoreUnavailable as exc:
                reply = self._unavailable(exc)
        # A delivery that failed for good: tell the sender not to retry, where it has a way.
        reply = provider.stop_retries(reply)
        self._report(provider.name, key.webhook_id, job.parsed.event_type, reply, started, headers)
        self._check_drift(job)
        return reply

    def _check_drift(self, job: Job) -> None:
        """Key drift of a fresh claim or queued receipt, as the statement that inserted it
        reported it (both stores, inline and queued)."""
        if self.metrics is not None and job.drift:
            self.metrics.drifted(job.claim.key.provider, job.claim.key.webhook_id)

    def _hint_drift(self, key: Key) -> None:
        """The key's signed content came before under another unsigned delivery id."""
        if self.metrics is not None:
            self.metrics.key_drift.labels(key.provider).inc()
        logger.warning(
            "ALERT: key drift: this signed content was already received under another delivery "
            "id (a captured delivery re-sent?); answered from its receipt",
            extra={"provider": key.provider, "webhook_id": key.webhook_id},
        )

    def refused(self, provider: str, headers: Headers, response: Response, check: str) -> Reply:
        """Report a delivery refused before verification (too large, unreadable)."""
        reply = Reply(response, Outcome.REJECTED, detail=check)
        self._report(provider, None, None, reply, time.perf_counter(), headers)
        return reply

    def unavailable(self, provider: str, headers: Headers, exc: StoreUnavailable) -> Reply:
        """Report a delivery answered 503 before it reached the pipeline (the receiver's store
        could not be opened, or its startup hooks have not run), as the pipeline's own."""
        reply = self._unavailable(exc)
        self._report(provider, None, None, reply, time.perf_counter(), headers)
        return reply

    def _report(
        self,
        provider: str,
        webhook_id: str | None,
        event_type: str | None,
        reply: Reply,
        started: float,
        headers: Headers,
    ) -> None:
        """One log line, the metrics and the trace attributes of one decision."""
        annotate(webhook_id, event_type)
        log_reply(provider, webhook_id, event_type, reply, started, headers)
        if self.metrics is not None:
            self.metrics.delivered(
                provider, reply.outcome.value, reply.detail, time.perf_counter() - started
            )

    async def recover(
        self,
        provider: Provider,
        receipt: Receipt,
        *,
        reconcile: bool = True,
        queued: queue.Queued | None = None,
    ) -> Reply | None:
        """Run a stored delivery again under the next fence, as a redelivery would
        (:meth:`.recovery.Recovery.recover`)."""
        return await self.recovery.recover(provider, receipt, reconcile=reconcile, queued=queued)

    # -- queued mode (receiver/_queue/, receiver/_webhooks/worker.py) ------------------------

    async def process(
        self,
        provider: Provider,
        webhook_id: str,
        body: bytes,
        event_type: str | None,
        fence: int,
        queued: queue.Queued,
    ) -> Reply:
        """Run a queued receipt that a worker has taken in flight under ``fence``, exactly as
        an inline delivery: the handlers in one transaction with the fenced completion."""
        return await self._run(
            self._queued_job(provider, webhook_id, body, event_type, queued), fence
        )

    async def process_together(self, attempts: Sequence[QueuedAttempt]) -> list[Reply | Exception]:
        """Run queued receipts that a worker has taken in flight, those whose handlers are all
        transactional in group transactions (:meth:`.groups.Groups.run`). Per attempt, in
        order: its reply, or the exception that left it in flight."""
        return await self.groups.run(attempts)

    async def _enqueue(self, job: Job) -> Reply:
        """Queued mode: record the receipt for the workers (micro-batched) and answer 202; a
        key already in the ledger is decided like any duplicate."""
        claim = job.claim
        recorded = await self.ingest.submit(claim)
        if recorded.inserted:
            job.drift = recorded.drift
            self._remember(job, queue.QUEUED)
            return Reply(replay(queue.QUEUED, replayed=False), Outcome.QUEUED, 0)
        async with self.store.acquire() as conn:
            receipt = await ledger.lookup(conn, claim.key, claim.now)
            if receipt is None:  # expired and deleted in between: the sender retries
                return self._busy(None, 1)
            decision = ledger.decide(receipt, claim.payload_hash)
            if decision is Decision.RECLAIM and await queue.requeue(conn, claim, receipt.fence):
                return Reply(replay(queue.QUEUED, replayed=False), Outcome.QUEUED, receipt.fence)
        if decision is Decision.REPLAY:
            assert receipt.response is not None
            if receipt.state is State.COMPLETED:
                self._remember(job, receipt.response)
            return Reply(replay(receipt.response, replayed=True), Outcome.REPLAYED)
        if decision is Decision.MISMATCH:
            return self._mismatch(claim.key)
        # In flight under an inline attempt (the mode changed), or taken over meanwhile.
        return self._in_flight(receipt)

    async def _claim_and_run(self, provider: Provider, job: Job) -> Reply:
        """Claim the key (one connection, one statement in the common case), then run."""
        claim = job.claim
        key = claim.key
        for _ in range(3):
            got = await self.shared.claim(claim)
            if isinstance(got, ledger.Claimed):
                job.drift = got.drift
                fence: int | None = got.fence
                settled = await resent.settle(self, provider, job, got.fence) if got.drift else None
                if settled is not None:
                    return settled
            else:
                receipt = got
                decision = ledger.decide(receipt, claim.payload_hash)
                if decision is Decision.REPLAY:
                    assert receipt.response is not None
                    if receipt.state is State.COMPLETED:
                        self._remember(job, receipt.response)
                    return Reply(replay(receipt.response, replayed=True), Outcome.REPLAYED)
                if decision is Decision.MISMATCH:
                    return self._mismatch(key)
                if decision is Decision.IN_FLIGHT:
                    return self._in_flight(receipt)
                if decision is Decision.RECOVER and has_external(job.handlers):
                    break
                async with self.store.acquire() as conn:
                    fence = await ledger.reclaim(conn, claim, receipt.fence)
                    if fence is not None and decision is Decision.RECOVER:
                        logger.warning(
                            "lease expired; running again under a new fence",
                            extra={
                                "provider": key.provider,
                                "webhook_id": key.webhook_id,
                                "event_type": claim.event_type,
                                "fence": fence,
                            },
                        )
                if fence is not None and provider.same_content != "run":
                    # Given back while the content it repeats was in flight: judged again.
                    settled = await resent.settle(self, provider, job, fence)
                    if settled is not None:
                        return settled
            if fence is not None:
                if job.turn is not None:
                    job.turn.begin()  # from here, it may be handed off at its sender's limit
                # In a group transaction where concurrent deliveries share one (PostgreSQL),
                # else alone.
                return await self.groups.run_inline(job, fence)
            # Another attempt reclaimed it between our lookup and our update: look again.
        else:
            return self._busy(None, 1)
        # Broken out of the loop: an interrupted attempt with external effects (reconciled
        # without holding a connection).
        return await self.recovery.external(job, receipt)
