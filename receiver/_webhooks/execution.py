"""The steps every delivery's attempt shares, once its key is claimed: run the handlers and
complete the receipt in one fenced transaction, or give the attempt back (released for the
sender's retry, scheduled for the workers' next attempt, or marked for review), and the answers
those steps give.

:class:`Execution` holds what a receiver's attempts share (the store, the handlers, the
deliveries this process is running, the batched claims and completions); the inline and queued
paths (:mod:`.pipeline`), the worker's group transactions (:mod:`.groups`) and recovery
(:mod:`.recovery`) build on it.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from starlette.datastructures import Headers

from .._exceptions import (
    LeaseLost,
    StoreMisconfigured,
    StoreReadOnly,
    StoreUnavailable,
)
from .._ledger import receipts as ledger
from .._ledger.cache import ReplayCache
from .._ledger.receipts import Claim, Key, Receipt, State, StoredResponse
from .._ledger.responses import IGNORED, encode, error, replay, stored_error
from .._ledger.results import Encoder, NotStorable
from .._ledger.shared import SharedStatements
from .._logging import get_logger
from .._ops.metrics import Metrics
from .._ops.redact import describe, is_driver_error, stack
from .._ops.review import needs_review
from .._queue import receipts as queue
from .._queue.ingest import Ingest
from .._store.base import Connection, Store
from .._verification.payload import parse
from .events import Event
from .handlers import Handler, Registry
from .jobs import Job, Running, event_for, has_external, identity
from .outcomes import (
    NEEDS_REVIEW,
    UNAVAILABLE,
    HandlerAnswered,
    Outcome,
    Reply,
    final_answer,
)
from .providers import Provider
from .rejections import answered_early, complete_early, counted, fail_early, invalid, rejected, sent
from .tracing import handler_span

logger = get_logger("receiver")


class Execution:
    """What one Receiver's attempts share, and the steps after a claim.

    No database connection is held while handlers run unless they use ``tx``: the claim and the
    completion each borrow one, and a handler's first statement borrows the one its transaction
    needs (see :class:`~receiver._store.base.LazyConnection`). Deliveries this process is running
    are remembered, so a duplicate arriving meanwhile is answered (409, or 422 for another
    payload) without waiting for a connection or SQLite's write lock.
    """

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
        self.store = store
        self.cache = cache
        self.encoder = encoder
        self.registry = registry
        self.clock = clock
        self.retry_after = retry_after
        self.metrics = metrics
        #: Keys whose handlers this process is running now.
        self._running: dict[Key, Running] = {}
        #: Queued deliveries' micro-batcher (receiver/_queue/ingest.py).
        self.ingest = Ingest(store)
        #: Completions of queued receipts, batched where the store batches.
        self._queue_done = queue.Completions(store)
        #: Claims, and completions of handlers that never touched tx, shared among concurrent
        #: deliveries where the store batches (receiver/_ledger/shared.py).
        self.shared = SharedStatements(store)
        #: Whether the handlers of a delivery wrote through tx the last time they ran, by the
        #: handlers' identities: an inline delivery whose handlers wrote nothing joins no
        #: group transaction (receiver/_webhooks/groups.py), since it would save it nothing.
        self.wrote: dict[tuple[int, ...], bool] = {}

    def _queued_job(
        self,
        provider: Provider,
        webhook_id: str,
        body: bytes,
        event_type: str | None,
        queued: queue.Queued,
    ) -> Job:
        job = self._prepare(provider, webhook_id, body, event_type, self.clock())
        job.queued = queued
        return job

    def _new_running(self, job: Job, fence: int) -> Running:
        return Running(job.claim.payload_hash, fence, self.clock() + job.claim.lease)

    def _running_of(self, job: Job, fence: int) -> Running:
        running = self._running.get(job.claim.key)
        return running if running is not None else self._new_running(job, fence)

    async def _reclaim(self, conn: Connection, job: Job, seen_fence: int) -> int | None:
        if job.queued is not None:
            return await queue.reclaim(conn, job.claim, seen_fence)
        return await ledger.reclaim(conn, job.claim, seen_fence)

    async def _finish(
        self, job: Job, fence: int, stored: StoredResponse, state: State = State.COMPLETED
    ) -> None:
        """The fenced completion, batched where the store batches: ``stored``, or for a
        delivery answered 202 before it finished (queued, handed off) that 202, and for its
        handlers' final 4xx a failure (:mod:`.rejections`)."""
        if state is State.COMPLETED and rejected(job, stored):
            async with self.store.acquire() as conn, conn.transaction():
                await complete_early(conn, job, fence, stored, self.store.now())
            return
        if job.queued is None:
            await self.shared.complete(job.claim.key, fence, sent(job, stored), state)
            return
        await self._queue_done.complete(job.claim.key, fence, state, job.queued.window)

    async def _give_back(self, job: Job, fence: int, exc: Exception) -> Reply:
        """After a failure: released for the sender's retry (inline), or scheduled for the
        workers' next attempt or failed as a dead letter (queued)."""
        if job.queued is None:
            return await self._failed(job.claim.key, fence, exc)
        key, q = job.claim.key, job.queued
        failed = q.failed + 1
        dead = q.backoff.is_last(failed)
        delay = 0.0 if dead else q.backoff.delay(failed)
        message = describe(exc)  # a driver's text carries payload values: never kept
        extra = {"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence}
        if dead:
            logger.error("ALERT: queued delivery failed its last attempt: dead letter", extra=extra)
        else:
            logger.warning("queued delivery failed; retry in %.1f s", delay, extra=extra)
        async with self.store.acquire() as conn:
            await queue.retry(
                conn,
                key,
                fence,
                message,
                self.store.now(),
                delay=delay,
                dead=dead,
                window=q.window,
            )
        outcome = Outcome.DEAD_LETTER if dead else Outcome.HANDLER_FAILED
        return Reply(error(500, "handler_failed", "the handler failed"), outcome, fence)

    def _prepare(
        self,
        provider: Provider,
        webhook_id: str,
        body: bytes,
        event_type: str | None,
        now: float,
        *,
        headers: Headers | None = None,
        timestamp: int | None = None,
        client: str | None = None,
    ) -> Job:
        parsed = parse(body, event_type, provider.attempt_field)
        handlers = () if parsed.problem else self.registry.match(provider.name, parsed.event_type)
        lease = max((h.lease for h in handlers if h.lease), default=provider.lease)
        claim = Claim(
            Key(provider.name, webhook_id),
            parsed.payload_hash,
            parsed.event_type or None,
            body,
            self.store.now(),
            lease,
            provider.window.window,
        )
        return Job(claim, parsed, handlers, headers, timestamp, client, now)

    def _unavailable(self, exc: StoreUnavailable) -> Reply:
        if isinstance(exc, StoreMisconfigured | StoreReadOnly):
            # Not a blip that passes by itself: say what to fix, on every delivery it refuses.
            logger.error("ALERT: delivery refused with 503: %s", exc)
        response = error(
            503,
            "store_unavailable",
            UNAVAILABLE.get(exc.kind, UNAVAILABLE["unavailable"]),
            {"retry-after": str(self.retry_after)},
        )
        return Reply(response, Outcome.STORE_UNAVAILABLE, detail=exc.kind)

    def _mismatch(self, key: Key) -> Reply:
        logger.warning(
            "ALERT: payload mismatch: same webhook-id, different payload",
            extra={"provider": key.provider, "webhook_id": key.webhook_id},
        )
        response = error(
            422, "payload_mismatch", "this webhook-id was already received with a different payload"
        )
        return Reply(response, Outcome.MISMATCH)

    def _remember(self, job: Job, response: StoredResponse) -> None:
        """Keep a completed receipt for replays by this process, until its window ends (as
        this process's clock counts it: the window starts at the claim, as the delivery
        arrived)."""
        if self.cache is not None and job.queued is None:
            claim = job.claim
            body_hash = hashlib.sha256(claim.body).digest()
            expires = job.arrived + claim.window
            self.cache.put(
                claim.key, claim.payload_hash, response, expires, body_hash, claim.event_type
            )

    def _in_flight(self, receipt: Receipt) -> Reply:
        return self._busy(receipt.fence, max(1, math.ceil(receipt.lease_until - receipt.now)))

    def _busy(self, fence: int | None, wait: int) -> Reply:
        response = error(
            409,
            "in_flight",
            "this delivery is being processed by another attempt; retry later",
            {"retry-after": str(min(wait, self.retry_after))},
        )
        return Reply(response, Outcome.IN_FLIGHT, fence)

    async def _run(
        self,
        job: Job,
        fence: int,
        *,
        handlers: Sequence[Handler] | None = None,
        answer: StoredResponse | None = None,
    ) -> Reply:
        """Run the handlers and complete the receipt in one transaction, fenced.

        After a reconcile, ``handlers`` are the transactional ones only and ``answer`` (the
        reconciled result) is stored instead of theirs.
        """
        key = job.claim.key
        if handlers is None:
            handlers = job.handlers
        if job.parsed.problem is not None:
            final = stored_error(400, "invalid_payload", job.parsed.problem)
            if answered_early(job):
                # Its sender, answered 202, never sees the 400: the reason is the attempt's
                # error (the parser's fixed text, never a payload value).
                async with self.store.acquire() as conn, conn.transaction():
                    error = invalid(job.parsed.problem)
                    await fail_early(conn, job, fence, error, self.store.now())
            else:
                await self._finish(job, fence, final, State.FAILED)
            return Reply(replay(final, replayed=False), Outcome.INVALID, fence)
        if not handlers and answer is None:
            await self._finish(job, fence, IGNORED)
            self._remember(job, sent(job, IGNORED))
            return Reply(replay(IGNORED, replayed=False), Outcome.IGNORED, fence)
        running = self._new_running(job, fence)
        self._running[key] = running
        try:
            return await self._execute(job, fence, handlers, answer, running)
        finally:
            if self._running.get(key) is running:
                del self._running[key]

    async def _execute(
        self,
        job: Job,
        fence: int,
        handlers: Sequence[Handler],
        answer: StoredResponse | None,
        running: Running,
    ) -> Reply:
        key = job.claim.key
        finished = False
        failure: Exception | None = None
        deferred: StoredResponse | None = None  # a completion left to the batcher
        async with self.store.lazy() as tx:
            event = event_for(job, fence, self._extender(tx, key, fence, running))
            try:
                # Begun by the handlers' first statement: handlers that never use tx borrow no
                # connection and cost no BEGIN/COMMIT, and the completion below is then one
                # autocommitted statement.
                async with tx.deferred_transaction():
                    result = await self._call(handlers, event, tx)
                    finished = True
                    self.wrote[identity(handlers)] = tx.in_transaction
                    stored = final_answer(answer or encode(result, self.encoder), key)
                    early = answered_early(job)  # from here, a handoff's answer is fixed
                    if tx.in_transaction and early:
                        await complete_early(tx, job, fence, stored, self.store.now())
                    elif tx.in_transaction:
                        # The handlers wrote: their writes and the fenced completion commit
                        # together, or not at all.
                        await ledger.complete(tx, key, fence, stored, self.store.now())
                    else:
                        deferred = stored
            except LeaseLost as exc:
                failure = exc
            except StoreUnavailable as exc:
                if finished:
                    # The completion itself (or its COMMIT) failed: the database's own failure.
                    # The claim stays in flight; its lease runs out and a redelivery recovers it.
                    raise
                # A statement the handlers sent failed to reach the store: their failure; if
                # the store is truly gone, the release below fails too (503).
                failure = exc
            except Exception as exc:
                # A handler's own exception, whatever its type (a downstream timeout, a refused
                # connection, a driver error of its own making): a handler failure, never 503.
                failure = exc
        if failure is None and deferred is not None:
            # The handlers never touched tx: their completion is one statement of its own,
            # shared with other deliveries' where the store batches.
            try:
                await self._finish(job, fence, deferred)
            except LeaseLost as exc:
                failure = exc
        if isinstance(failure, LeaseLost):
            return await self._lease_lost(key, fence, handlers if finished else None)
        if isinstance(failure, NotStorable) and finished and has_external(handlers):
            # The external effect happened; releasing would let the retry run it again.
            logger.error(
                "ALERT: a handler with external effects returned a %s, which cannot be stored (%s)",
                failure.type_name,
                failure,
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            )
            reason = (
                f"a handler with external effects acted, then returned a {failure.type_name}, "
                "which cannot be stored; check the outside system, then `receiver replay`"
            )
            return await self._mark_for_review(job, fence, reason)
        if failure is not None:
            return await self._give_back(job, fence, failure)
        self._remember(job, sent(job, stored))
        outcome = counted(
            job, fence, stored, Outcome.EXECUTED if answer is None else Outcome.RECONCILED
        )
        return Reply(replay(sent(job, stored), replayed=False), outcome, fence)

    async def _call(self, handlers: Sequence[Handler], event: Event, conn: Connection) -> Any:
        """Run the handlers in order; the last non-None result is the answer."""
        began = time.perf_counter()
        try:
            result: Any = None
            for handler in handlers:
                with handler_span(handler, event):
                    returned = await handler.func(event, conn)
                if returned is not None:
                    result = returned
            return result
        finally:
            if self.metrics is not None:
                self.metrics.handler_time(event.provider, time.perf_counter() - began)

    async def _lease_lost(self, key: Key, fence: int, finished: Sequence[Handler] | None) -> Reply:
        """The fenced completion was refused and the attempt rolled back; ``finished``: the
        handlers, if they had run to the end."""
        if finished is not None:
            await self._ran_twice(key, fence, finished)
        logger.warning(
            "lease lost: a newer attempt owns this delivery; rolled back",
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
        )
        response = error(
            409, "in_flight", "a newer attempt owns this delivery", {"retry-after": "1"}
        )
        return Reply(response, Outcome.LEASE_LOST, fence)

    async def _ran_twice(self, key: Key, fence: int, handlers: Sequence[Handler]) -> None:
        """The handlers ran to the end, then the fenced completion was refused. If another
        attempt has completed the key, its handlers ran to the end twice: a double execution.
        The fence rolled back this attempt's writes through ``tx``; nothing else it did."""
        try:
            async with self.store.acquire() as conn:
                receipt = await ledger.lookup(conn, key, self.store.now())
        except StoreUnavailable:
            return
        if receipt is None or receipt.state is not State.COMPLETED:
            return
        evidence = "external" if has_external(handlers) else "fenced"
        logger.error(
            "ALERT: double execution: the handlers ran to the end twice for one key "
            "(%s: this attempt was fenced out after another completed it)",
            evidence,
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
        )
        if self.metrics is not None:
            self.metrics.double_execution(key.provider, evidence)

    async def _failed(self, key: Key, fence: int, exc: Exception) -> Reply:
        """The handlers raised or answered 5xx: their transaction rolled back; release the key
        (on a connection of its own: the handlers' may be broken) so that the sender's retry
        runs them again, and keep the error. Only if the release cannot reach the store is the
        answer 503."""
        # A driver's text carries payload values: described without them, and logged with the
        # stack only (issue 14 item 12).
        message = describe(exc)
        where = {"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence}
        if is_driver_error(exc):
            logger.error("handler failed; claim released: %s\n%s", message, stack(exc), extra=where)
        else:
            logger.error(
                "handler failed; claim released",
                extra=where,
                # The exception itself: this runs after its except block has ended.
                exc_info=None if isinstance(exc, HandlerAnswered) else exc,
            )
        async with self.store.acquire() as conn:
            await ledger.release(conn, key, fence, message, self.store.now())
        if isinstance(exc, StoreMisconfigured | StoreReadOnly):
            # The handlers' own statement met the store's misconfiguration (a pooler not
            # declared, a standby): released like any failure, answered as the store's, 503.
            return self._unavailable(exc)
        if isinstance(exc, HandlerAnswered) and exc.response.status == 429:
            return Reply(replay(exc.response, replayed=False), Outcome.HANDLER_FAILED, fence)
        response = error(500, "handler_failed", "the handler failed; retry later")
        return Reply(response, Outcome.HANDLER_FAILED, fence)

    async def _mark_for_review(self, job: Job, fence: int, reason: str) -> Reply:
        """Store a final answer that needs a person (an external effect may have happened and
        nothing can say): every redelivery replays it; nothing runs again."""
        key = job.claim.key
        if job.queued is None:
            # Handed off, its sender was answered 202: that stays its answer.
            answer = sent(job, NEEDS_REVIEW)
            async with self.store.acquire() as conn:
                await needs_review(conn, key, fence, answer, reason, self.store.now(), self.metrics)
        else:
            # A queued receipt keeps its stored 202: the queue's completion, then the alert.
            await self._finish(job, fence, NEEDS_REVIEW, State.FAILED)
            logger.error(
                "ALERT: receipt needs review: %s",
                reason,
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            )
            if self.metrics is not None:
                self.metrics.needs_review(key.provider)
        return Reply(replay(NEEDS_REVIEW, replayed=False), Outcome.NEEDS_REVIEW, fence)

    def _extender(
        self, tx: Connection, key: Key, fence: int, running: Running | None = None
    ) -> Callable[[float], Any]:
        async def extend(seconds: float) -> None:
            if running is not None:
                running.lease_until = self.clock() + seconds
            if self.store.dialect == "sqlite" and tx.in_transaction:
                # The handler's transaction holds SQLite's only write lock, so no other attempt
                # can take the key over before it ends anyway; extend within it.
                await ledger.extend_lease(tx, key, fence, self.store.now(), seconds)
                return
            # Outside the handlers' transaction: an update inside it would stay invisible to
            # other attempts until it committed, which is too late to help. The store lends a
            # connection that does not come from the (possibly exhausted) pool.
            async with self.store.acquire_aside() as other:
                await ledger.extend_lease(other, key, fence, self.store.now(), seconds)

        return extend
