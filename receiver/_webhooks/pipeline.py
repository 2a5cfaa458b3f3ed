"""One delivery, step by step: verify, parse, claim, decide, run, answer.

This module is the whole behaviour of README.md "What the sender gets". The order is the
guarantee: nothing touches the store before verification passes (I5), and no handler runs
without a claim of its key (I1). Every delivery ends in one :class:`~.outcomes.Reply`: the
response and the :class:`~.outcomes.Outcome` that metrics and logs report.

The :class:`Pipeline` reads in the order a delivery meets it: the inline path (``deliver``),
the recovery of a stored delivery (``recover``), the queued mode's two halves (``process`` and
``_enqueue``), then the steps they share (claim, run, complete or give back) and the external
handlers' reconcile path. What a delivery is between steps is :mod:`.jobs`; how it ends is
:mod:`.outcomes`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

from .._exceptions import (
    LeaseLost,
    StoreMisconfigured,
    StoreReadOnly,
    StoreUnavailable,
    VerificationError,
)
from .._ledger import receipts as ledger
from .._ledger.cache import ReplayCache
from .._ledger.receipts import Claim, Decision, Key, Receipt, State, StoredResponse
from .._ledger.responses import IGNORED, encode, error, replay, stored_error
from .._ledger.results import Encoder, NotStorable, RunAgain
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
from .jobs import Job, Running, event_for, has_external, may_share, queued_mode
from .outcomes import (
    NEEDS_REVIEW,
    UNAVAILABLE,
    HandlerAnswered,
    Outcome,
    Reply,
    final_answer,
    log_reply,
)
from .providers import Provider
from .tracing import annotate, handler_span

logger = get_logger("receiver")


class Pipeline:
    """Processes deliveries for one Receiver.

    No database connection is held while handlers run unless they use ``tx``: the claim and the
    completion each borrow one, and a handler's first statement borrows the one its transaction
    needs (see :class:`~receiver._store.base.LazyConnection`). Deliveries this process is running
    are
    remembered, so a duplicate arriving meanwhile is answered (409, or 422 for another payload)
    without waiting for a connection or SQLite's write lock.
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

    async def deliver(
        self, provider: Provider, headers: Headers, body: bytes, client: str | None = None
    ) -> Reply:
        started = time.perf_counter()
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
                reply = await (self._enqueue(job) if queued else self._claim_and_run(job))
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
        """Run a stored delivery again under the next fence, as a redelivery would: the
        sweeper's recovery of a stale in-flight receipt (external handlers are reconciled,
        never re-run blindly), or with ``reconcile=False`` an operator's dead-letter replay of a
        released, lease-expired or reopened receipt (external handlers run again too: the
        operator asked). None if another attempt took the receipt over first, or if this
        process is still running it (its lease ran out, but the attempt is alive)."""
        running = self._running.get(receipt.key)
        if running is not None and running.lease_until > self.clock():
            return None
        # The body is kept until completion, and the type as claimed (from the body or, for
        # GitHub-like schemes, from a header), so the job is rebuilt exactly; only the headers
        # of the original request are not kept.
        job = self._prepare(
            provider,
            receipt.key.webhook_id,
            receipt.request_body or b"",
            receipt.event_type,
            self.clock(),
        )
        job.queued = (
            queued  # a worker's recovery of a queued receipt (receiver/_webhooks/worker.py)
        )
        if reconcile and has_external(job.handlers):
            return await self._recover_external(job, receipt)
        async with self.store.acquire() as conn:
            fence = await self._reclaim(conn, job, receipt.fence)
        if fence is None:
            return None
        return await self._run(job, fence)

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
        """Run queued receipts that a worker has taken in flight: those whose handlers are all
        transactional in group transactions (PostgreSQL workers), the others as
        :meth:`process` runs them.

        A delivery alone pays BEGIN, its handlers' statements, its completion and COMMIT, a
        round trip each; a group pays one BEGIN, one pipelined statement for every
        completion and one COMMIT, and its members' handlers run one after another on the
        group's connection. When a group's handlers have run for ``GROUP_BUDGET`` seconds,
        the members it has not begun start at once on their own, so slow handlers run side
        by side as they would without groups (and a handler waiting for another delivery's
        never waits for a group to reach it).

        A group is all or nothing:

        - a member whose handlers raise has failed its attempt, as it would have alone
          (retried or dead-lettered, the error kept); the members before it, rolled back with
          it, run again, and the ones after it go on in the next group;
        - a member whose fence went stale (a newer attempt owns it) is lease lost, and the
          others run again;
        - when the failure is not one member's (the connection broke, or a handler swallowed
          a database error that aborted the transaction), each member runs again on its own;
        - if the COMMIT itself fails, whether it happened is unknown: the members stay in
          flight for the stale recovery, as a lone attempt's do.

        Per attempt, in order: its reply, or the exception that left it in flight.
        """
        jobs = [
            (self._queued_job(provider, webhook_id, body, event_type, queued), fence)
            for provider, webhook_id, body, event_type, fence, queued in attempts
        ]
        shared = [i for i, (job, _) in enumerate(jobs) if _may_share(job)]
        alone = [i for i, (job, _) in enumerate(jobs) if not _may_share(job)]
        for i in shared:
            job, fence = jobs[i]
            self._running[job.claim.key] = self._new_running(job, fence)
        try:
            together = await self._share([jobs[i] for i in shared])
        finally:
            for i in shared:
                self._running.pop(jobs[i][0].claim.key, None)
        replies: dict[int, Reply | Exception] = dict(zip(shared, together, strict=True))
        ran_alone = await _gathered(self._run(*jobs[i]) for i in alone)
        replies.update(zip(alone, ran_alone, strict=True))
        return [replies[i] for i in range(len(jobs))]

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

    async def _share(self, members: Sequence[tuple[Job, int]]) -> list[Reply | Exception]:
        """Run ``members`` in group transactions (see :meth:`process_together`)."""
        replies: dict[int, Reply | Exception] = {}
        spilled: dict[int, asyncio.Task[Reply]] = {}
        alone: list[int] = []
        pending = list(range(len(members)))
        try:
            while pending:
                group = _Group([members[i] for i in pending])
                outcome = await self._run_group(group)
                took, rest = pending[: len(outcome)], pending[len(outcome) :]
                spilled.update(zip(rest, group.spilled, strict=False))
                rest = rest[len(group.spilled) :]
                again = [i for i, reply in zip(took, outcome, strict=True) if reply is None]
                replies.update((i, r) for i, r in zip(took, outcome, strict=True) if r is not None)
                if len(again) == len(took):
                    alone += again  # nobody's failure: each on its own
                    pending = rest
                else:
                    pending = again + rest
            ran_alone = await _gathered(self._alone(*members[i]) for i in alone)
            replies.update(zip(alone, ran_alone, strict=True))
            replies.update(zip(spilled, await _gathered(spilled.values()), strict=True))
        except BaseException:
            for task in spilled.values():
                task.cancel()
            raise
        return [replies[i] for i in range(len(members))]

    def _alone(self, job: Job, fence: int) -> Awaitable[Reply]:
        return self._execute(job, fence, job.handlers, None, self._running_of(job, fence))

    async def _run_group(self, group: _Group) -> list[Reply | Exception | None]:
        """One group transaction: for each member it began, its reply, or None if it must run
        again; the members it did not begin were started on their own (``group.spilled``) or
        are left for the next group.

        As for a delivery alone, the transaction begins with the first statement a handler
        sends: when none does (no-op handlers), the group costs no BEGIN and no COMMIT, and its
        completions join the batched ones of deliveries alone."""
        ran: list[tuple[Job, int]] = []
        committing = False
        timer = asyncio.get_running_loop().call_later(GROUP_BUDGET, self._spill, group, ran)
        try:
            async with self.store.lazy() as tx, tx.deferred_transaction():
                for job, fence in group.members:
                    if group.spilled:
                        break
                    ran.append((job, fence))
                    await self._run_member(job, fence, tx)
                timer.cancel()
                if ran and tx.in_transaction:
                    done = await queue.complete_many(
                        tx,
                        [
                            queue.Done(job.claim.key, fence, State.COMPLETED, _queue_window(job))
                            for job, fence in ran
                        ],
                        self.store.now(),
                    )
                    if not all(done):
                        raise _Stale(done)
                    committing = True
        except _Stale as stale:  # rolled back: the members whose fence held run again
            lost: list[Reply | Exception | None] = []
            for (job, fence), held in zip(ran, stale.done, strict=True):
                lost.append(None if held else await self._lease_lost(job.claim.key, fence, None))
            return lost
        except _MemberFailed as failed:  # rolled back: the failure is the last member's
            job, fence = ran[-1]
            cause = failed.__cause__
            assert isinstance(cause, Exception)
            if isinstance(cause, StoreUnavailable) or _aborted_before(cause):
                return [None] * len(ran)
            answered: list[Reply | Exception | None] = [None] * (len(ran) - 1)
            return [*answered, await self._give_back(job, fence, cause)]
        except Exception as exc:
            if committing:
                return [exc] * len(ran)
            return [None] * len(ran) if ran else [None] * (len(group.members) - len(group.spilled))
        finally:
            timer.cancel()
        if committing:
            return [_executed(fence) for _, fence in ran]
        # No handler wrote: each completion is a statement of its own, shared where the store
        # batches, as for a delivery alone.
        finished = await asyncio.gather(
            *(self._finish(job, fence, IGNORED) for job, fence in ran), return_exceptions=True
        )
        replies: list[Reply | Exception | None] = []
        for (job, fence), result in zip(ran, finished, strict=True):
            if isinstance(result, LeaseLost):
                replies.append(await self._lease_lost(job.claim.key, fence, job.handlers))
            elif isinstance(result, Exception):
                replies.append(result)  # left in flight, as alone
            elif isinstance(result, BaseException):
                raise result
            else:
                replies.append(_executed(fence))
        return replies

    def _spill(self, group: _Group, ran: Sequence[tuple[Job, int]]) -> None:
        """The group's budget ran out: the members it has not begun start on their own now."""
        group.spilled = [
            asyncio.ensure_future(self._alone(job, fence))
            for job, fence in group.members[len(ran) :]
        ]

    async def _run_member(self, job: Job, fence: int, conn: Connection) -> None:
        """One member's handlers, in the group's transaction; _MemberFailed if they fail."""
        key = job.claim.key
        extend = self._extender(conn, key, fence, self._running_of(job, fence))
        try:
            result = await self._call(job.handlers, event_for(job, fence, extend), conn)
            final_answer(encode(result, self.encoder), key)
        except Exception as exc:
            raise _MemberFailed from exc

    def _new_running(self, job: Job, fence: int) -> Running:
        return Running(job.claim.payload_hash, fence, self.clock() + job.claim.lease)

    def _running_of(self, job: Job, fence: int) -> Running:
        running = self._running.get(job.claim.key)
        return running if running is not None else self._new_running(job, fence)

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

    async def _reclaim(self, conn: Connection, job: Job, seen_fence: int) -> int | None:
        if job.queued is not None:
            return await queue.reclaim(conn, job.claim, seen_fence)
        return await ledger.reclaim(conn, job.claim, seen_fence)

    async def _finish(
        self, job: Job, fence: int, stored: StoredResponse, state: State = State.COMPLETED
    ) -> None:
        """:meth:`_complete`, or for a queued receipt the queue's completion (which keeps the
        stored 202), batched like :meth:`_complete` where the store batches."""
        if job.queued is None:
            await self.shared.complete(job.claim.key, fence, stored, state)
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
        parsed = parse(body, event_type)
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

    async def _claim_and_run(self, job: Job) -> Reply:
        """Claim the key (one connection, one statement in the common case), then run."""
        claim = job.claim
        key = claim.key
        for _ in range(3):
            got = await self.shared.claim(claim)
            if isinstance(got, ledger.Claimed):
                job.drift = got.drift
                fence: int | None = got.fence
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
            if fence is not None:
                return await self._run(job, fence)
            # Another attempt reclaimed it between our lookup and our update: look again.
        else:
            return self._busy(None, 1)
        # Broken out of the loop: an interrupted attempt with external effects (reconciled
        # without holding a connection).
        return await self._recover_external(job, receipt)

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
            await self._finish(job, fence, final, State.FAILED)
            return Reply(replay(final, replayed=False), Outcome.INVALID, fence)
        if not handlers and answer is None:
            await self._finish(job, fence, IGNORED)
            self._remember(job, IGNORED)
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
                    stored = final_answer(answer or encode(result, self.encoder), key)
                    if tx.in_transaction and job.queued is not None:
                        await queue.complete(
                            tx, key, fence, State.COMPLETED, self.store.now(), job.queued.window
                        )
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
                "ALERT: a handler with external effects returned a %s, which cannot be stored as "
                "JSON (pass encoder= to the Receiver to store such results)",
                failure.type_name,
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            )
            reason = (
                f"a handler with external effects acted, then returned a {failure.type_name}, "
                "which cannot be stored; check the outside system, then `receiver replay`"
            )
            return await self._mark_for_review(job, fence, reason)
        if failure is not None:
            return await self._give_back(job, fence, failure)
        self._remember(job, stored)
        outcome = Outcome.EXECUTED if answer is None else Outcome.RECONCILED
        return Reply(replay(stored, replayed=False), outcome, fence)

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

    async def _recover_external(self, job: Job, receipt: Receipt) -> Reply:
        """An attempt with external effects died or stalled. Never re-run it blindly: each
        external handler's reconcile() asks the outside world what happened."""
        key = job.claim.key
        async with self.store.acquire() as conn:
            fence = await self._reclaim(conn, job, receipt.fence)
        if fence is None:
            return self._in_flight(receipt)
        externals = [h for h in job.handlers if h.effects == "external"]
        if any(h.reconcile is None for h in externals):
            reason = (
                "an attempt of an external handler without reconcile() was interrupted: it may "
                "or may not have acted; check the outside system, then `receiver replay`"
            )
            return await self._mark_for_review(job, fence, reason)
        async with self.store.lazy() as conn:
            event = event_for(job, fence, self._extender(conn, key, fence))
            try:
                results = [await h.reconcile(event) for h in externals if h.reconcile is not None]
            except Exception as exc:
                failure: Exception | None = exc
            else:
                failure = None
        if failure is not None:
            return await self._reconcile_failed(job, fence, failure)
        if any(isinstance(r, RunAgain) for r in results):
            return await self._run(job, fence)
        # The external effects happened; the transactional handlers' writes died with the
        # interrupted transaction, so they run again, and the reconciled answer is stored.
        answer = next((r for r in reversed(results) if r is not None), None)
        try:
            reconciled = encode(answer, self.encoder)
        except NotStorable as exc:
            reason = (
                f"reconcile() returned a {exc.type_name}, which cannot be stored; check the "
                "outside system, then `receiver replay`"
            )
            return await self._mark_for_review(job, fence, reason)
        transactional = [h for h in job.handlers if h.effects == "transactional"]
        return await self._run(job, fence, handlers=transactional, answer=reconciled)

    async def _mark_for_review(self, job: Job, fence: int, reason: str) -> Reply:
        """Store a final answer that needs a person (an external effect may have happened and
        nothing can say): every redelivery replays it; nothing runs again."""
        key = job.claim.key
        if job.queued is None:
            async with self.store.acquire() as conn:
                await needs_review(
                    conn, key, fence, NEEDS_REVIEW, reason, self.store.now(), self.metrics
                )
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
        async with self.store.acquire() as conn:
            await ledger.unresolved(conn, key, fence, message, self.store.now())
        response = error(500, "handler_failed", "reconciling the delivery failed; retry later")
        return Reply(response, Outcome.HANDLER_FAILED, fence)

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


#: Seconds of a group transaction's handlers after which the members it has not begun start
#: on their own (Pipeline.process_together).
GROUP_BUDGET = 0.05

#: A queued receipt a worker has taken in flight: its provider, webhook-id, body, event type,
#: fence, and its attempts so far (:meth:`Pipeline.process_together`).
QueuedAttempt = tuple[Provider, str, bytes, "str | None", int, queue.Queued]


@dataclass(slots=True)
class _Group:
    """The members a group transaction may take, in order, and those it started on their own
    when its budget ran out."""

    members: Sequence[tuple[Job, int]]
    spilled: list[asyncio.Task[Reply]] = field(default_factory=list)


async def _gathered(work: Iterable[Awaitable[Reply]]) -> list[Reply | Exception]:
    """Every reply, or the exception that left its attempt in flight."""
    results = await asyncio.gather(*work, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
    return results  # type: ignore[return-value]


class _MemberFailed(Exception):
    """A group member's handlers failed (the cause): roll the group back."""


class _Stale(Exception):
    """A group's completions found a stale fence: roll the group back."""

    def __init__(self, done: list[bool]) -> None:
        super().__init__("a member's fence is stale")
        self.done = done


def _may_share(job: Job) -> bool:
    """A body that does not parse is answered alone (400, failed), whatever its handlers."""
    return job.parsed.problem is None and may_share(job.handlers)


def _aborted_before(exc: Exception) -> bool:
    """Whether a statement failed because the transaction was already aborted (SQLSTATE 25P02):
    an earlier member swallowed a database error, so this member's failure is not its own."""
    return getattr(exc, "sqlstate", None) == "25P02"


def _executed(fence: int) -> Reply:
    """A group member's reply (the worker counts its outcome; the sender's answer, the 202,
    is stored)."""
    return Reply(replay(queue.QUEUED, replayed=False), Outcome.EXECUTED, fence)


def _queue_window(job: Job) -> float:
    assert job.queued is not None
    return job.queued.window
