"""One delivery, step by step: verify, parse, claim, decide, run, answer.

This module is the whole behaviour of DESIGN.md "One delivery, step by step". The order is the
guarantee: nothing touches the store before verification passes (I5), and no handler runs
without a claim of its key (I1). Every delivery ends in one :class:`Reply`: the response and
the :class:`Outcome` that metrics and logs report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.responses import Response

from . import _ledger as ledger
from ._cache import ReplayCache
from ._events import Event
from ._exceptions import (
    LeaseLost,
    StoreMisconfigured,
    StoreReadOnly,
    StoreUnavailable,
    VerificationError,
)
from ._handlers import Handler, Registry
from ._ledger import Claim, Decision, Key, Receipt, State, StoredResponse
from ._metrics import Metrics
from ._payload import Parsed, parse
from ._providers import Provider
from ._redact import describe, is_driver_error, stack
from ._responses import IGNORED, encode, error, replay, stored_error
from ._review import needs_review
from ._store import Connection, Store

logger = logging.getLogger("receiver")


class Outcome(enum.StrEnum):
    """How a delivery ended; one label value of the deliveries metric."""

    EXECUTED = "executed"
    REPLAYED = "replayed"
    IGNORED = "ignored"
    IN_FLIGHT = "in_flight_conflict"
    MISMATCH = "payload_mismatch"
    REJECTED = "rejected"
    INVALID = "invalid_payload"
    HANDLER_FAILED = "handler_failed"
    LEASE_LOST = "lease_lost"
    RECONCILED = "reconciled"
    NEEDS_REVIEW = "needs_review"
    STORE_UNAVAILABLE = "store_unavailable"


@dataclass(frozen=True, slots=True)
class Reply:
    """How one delivery (or replay) was answered: the response and its :class:`Outcome`."""

    response: Response
    outcome: Outcome
    fence: int | None = None
    detail: str | None = None  # the failed check of a rejection


# Outcomes of a delivery that claimed its key just now (with fence 1): checked for key drift.
_FRESH = frozenset({Outcome.EXECUTED, Outcome.IGNORED, Outcome.HANDLER_FAILED})


class RunAgain:
    """Returned by a ``reconcile`` function: the external effect did not happen, run the
    handlers again."""

    def __repr__(self) -> str:
        return "RUN_AGAIN"


RUN_AGAIN = RunAgain()

_NEEDS_REVIEW = StoredResponse(
    202,
    "application/json",
    b'{"status":"needs_review","detail":"an attempt with external effects was interrupted '
    b'and cannot be safely re-run; an operator was alerted"}',
)


# What a sender is told when the store fails (the fix is for the operator's logs, not for it).
_UNAVAILABLE = {
    "unavailable": "the receipt store is unavailable; retry later",
    "read_only": "the receipt store is read-only (failing over?); retry later",
    "misconfigured": "the receipt store is misconfigured; retry later",
}


class _Retryable(Exception):
    """A handler answered 5xx (or 429): roll back and release, never store it as the truth."""

    def __init__(self, response: StoredResponse) -> None:
        super().__init__(f"handler answered {response.status}")
        self.response = response


@dataclass(slots=True)
class _Job:
    """Everything about one delivery that the steps after verification need."""

    claim: Claim
    parsed: Parsed
    handlers: Sequence[Handler]
    event: Event
    #: Set by a fresh claim: the payload is already in the window under another webhook-id
    #: (None: the store did not check, see :meth:`Pipeline.deliver`).
    drift: bool | None = None


class Pipeline:
    """Processes deliveries for one Receiver."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        clock: Callable[[], float],
        retry_after: int,
        metrics: Metrics | None = None,
        cache: ReplayCache | None = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.registry = registry
        self.clock = clock
        self.retry_after = retry_after
        self.metrics = metrics

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
            self._report(provider.name, key.webhook_id, None, reply, started, headers)
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
        if hit is not None and hit.payload_hash == job.claim.payload_hash:
            reply = Reply(replay(hit.response, replayed=True), Outcome.REPLAYED)
        elif hit is not None:
            reply = self._mismatch(key)
        else:
            try:
                async with self.store.acquire() as conn:
                    reply = await self._claim_and_run(conn, job)
            except StoreUnavailable as exc:
                reply = self._unavailable(exc)
        self._report(provider.name, key.webhook_id, job.parsed.event_type, reply, started, headers)
        self._check_drift(job, reply)
        return reply

    def _check_drift(self, job: _Job, reply: Reply) -> None:
        """Key drift of a fresh claim: known from PostgreSQL's claim statement; for a store
        whose claim cannot tell (SQLite), checked after the answer is sent."""
        if self.metrics is None:
            return
        key = job.claim.key
        if job.drift:
            self.metrics.drifted(key.provider, key.webhook_id)
        elif job.drift is None and reply.fence == 1 and reply.outcome in _FRESH:
            reply.response.background = BackgroundTask(
                self.metrics.check_drift,
                self.store,
                key.provider,
                key.webhook_id,
                job.parsed.payload_hash,
                job.claim.now,
            )

    def refused(self, provider: str, headers: Headers, response: Response, check: str) -> Reply:
        """Report a delivery refused before verification (too large, unreadable)."""
        reply = Reply(response, Outcome.REJECTED, detail=check)
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
        """One log line and the metrics of one decision."""
        _log(provider, webhook_id, event_type, reply, started, headers)
        if self.metrics is not None:
            self.metrics.delivered(
                provider, reply.outcome.value, reply.detail, time.perf_counter() - started
            )

    async def recover(
        self, provider: Provider, receipt: Receipt, *, reconcile: bool = True
    ) -> Reply | None:
        """Run a stored delivery again under the next fence, as a redelivery would: the
        sweeper's recovery of a stale in-flight receipt (external handlers are reconciled,
        never re-run blindly), or with ``reconcile=False`` an operator's dead-letter replay of a
        released, lease-expired or reopened receipt (external handlers run again too: the
        operator asked). None if another attempt took the receipt over first."""
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
        async with self.store.acquire() as conn:
            if reconcile and _external(job.handlers):
                return await self._recover_external(conn, job, receipt)
            fence = await ledger.reclaim(conn, job.claim, receipt.fence)
            if fence is None:
                return None
            return await self._run(conn, job, fence)

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
    ) -> _Job:
        parsed = parse(body, event_type)
        handlers = () if parsed.problem else self.registry.match(provider.name, parsed.event_type)
        lease = max((h.lease for h in handlers if h.lease), default=provider.lease)
        claim = Claim(
            Key(provider.name, webhook_id),
            parsed.payload_hash,
            parsed.event_type or None,
            body,
            now,
            lease,
            provider.window.window,
        )
        event = Event(
            provider=provider.name,
            id=webhook_id,
            type=parsed.event_type,
            payload=parsed.payload,
            body=body,
            headers=headers if headers is not None else Headers(),
            timestamp=_datetime(timestamp),
            client=client,
        )
        return _Job(claim, parsed, handlers, event)

    def _unavailable(self, exc: StoreUnavailable) -> Reply:
        if isinstance(exc, StoreMisconfigured | StoreReadOnly):
            # Not a blip that passes by itself: say what to fix, on every delivery it refuses.
            logger.error("ALERT: delivery refused with 503: %s", exc)
        response = error(
            503,
            "store_unavailable",
            _UNAVAILABLE.get(exc.kind, _UNAVAILABLE["unavailable"]),
            {"retry-after": str(self.retry_after)},
        )
        return Reply(response, Outcome.STORE_UNAVAILABLE, detail=exc.kind)

    async def _claim_and_run(self, conn: Connection, job: _Job) -> Reply:
        claim = job.claim
        key = claim.key
        for _ in range(3):
            got = await ledger.claim(conn, claim)
            if isinstance(got, ledger.Claimed):
                job.drift = got.drift
                return await self._run(conn, job, got.fence)
            receipt = got
            decision = ledger.decide(receipt, claim.payload_hash, claim.now)
            if decision is Decision.REPLAY:
                assert receipt.response is not None
                if receipt.state is State.COMPLETED:
                    self._remember(job, receipt.response, receipt.expires_at)
                return Reply(replay(receipt.response, replayed=True), Outcome.REPLAYED)
            if decision is Decision.MISMATCH:
                return self._mismatch(key)
            if decision is Decision.IN_FLIGHT:
                return self._in_flight(receipt, claim.now)
            if decision is Decision.RECOVER and _external(job.handlers):
                return await self._recover_external(conn, job, receipt)
            fence = await ledger.reclaim(conn, claim, receipt.fence)
            if fence is not None:
                if decision is Decision.RECOVER:
                    logger.warning(
                        "lease expired; running again under a new fence",
                        extra={"provider": key.provider, "webhook_id": key.webhook_id},
                    )
                return await self._run(conn, job, fence)
            # Another attempt reclaimed it between our lookup and our update: look again.
        response = error(409, "in_flight", "the delivery is being processed", {"retry-after": "1"})
        return Reply(response, Outcome.IN_FLIGHT)

    def _mismatch(self, key: Key) -> Reply:
        logger.warning(
            "ALERT: payload mismatch: same webhook-id, different payload",
            extra={"provider": key.provider, "webhook_id": key.webhook_id},
        )
        response = error(
            422, "payload_mismatch", "this webhook-id was already received with a different payload"
        )
        return Reply(response, Outcome.MISMATCH)

    def _remember(self, job: _Job, response: StoredResponse, expires_at: float) -> None:
        """Keep a completed receipt for replays by this process."""
        if self.cache is not None:
            claim = job.claim
            body_hash = hashlib.sha256(claim.body).digest()
            self.cache.put(claim.key, claim.payload_hash, response, expires_at, body_hash)

    def _in_flight(self, receipt: Receipt, now: float) -> Reply:
        wait = max(1, math.ceil(receipt.lease_until - now))
        response = error(
            409,
            "in_flight",
            "this delivery is being processed by another attempt; retry later",
            {"retry-after": str(min(wait, self.retry_after))},
        )
        return Reply(response, Outcome.IN_FLIGHT, receipt.fence)

    async def _run(
        self,
        conn: Connection,
        job: _Job,
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
            await ledger.complete(conn, key, fence, final, self.clock(), state=State.FAILED)
            return Reply(replay(final, replayed=False), Outcome.INVALID, fence)
        claim = job.claim
        if not handlers and answer is None:
            await ledger.complete(conn, key, fence, IGNORED, self.clock())
            self._remember(job, IGNORED, claim.now + claim.window)
            return Reply(replay(IGNORED, replayed=False), Outcome.IGNORED, fence)
        event = _with_fence(job.event, fence, self._extender(conn, key, fence))
        finished = False
        try:
            # Begun by the handlers' first statement: handlers that never use tx cost no
            # BEGIN/COMMIT, and the completion below is then one autocommitted statement.
            async with conn.deferred_transaction():
                result = await self._call(handlers, event, conn)
                finished = True
                stored = _final(answer or encode(result), key)
                await ledger.complete(conn, key, fence, stored, self.clock())
        except LeaseLost:
            if finished:
                await self._ran_twice(conn, key, fence, handlers)
            logger.warning(
                "lease lost: a newer attempt owns this delivery; rolled back",
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            )
            response = error(
                409, "in_flight", "a newer attempt owns this delivery", {"retry-after": "1"}
            )
            return Reply(response, Outcome.LEASE_LOST, fence)
        except StoreUnavailable:
            raise
        except Exception as exc:
            return await self._failed(conn, key, fence, exc)
        self._remember(job, stored, claim.now + claim.window)
        outcome = Outcome.EXECUTED if answer is None else Outcome.RECONCILED
        return Reply(replay(stored, replayed=False), outcome, fence)

    async def _call(self, handlers: Sequence[Handler], event: Event, conn: Connection) -> Any:
        """Run the handlers in order; the last non-None result is the answer."""
        began = time.perf_counter()
        try:
            result: Any = None
            for handler in handlers:
                returned = await handler.func(event, conn)
                if returned is not None:
                    result = returned
            return result
        finally:
            if self.metrics is not None:
                self.metrics.handler_time(event.provider, time.perf_counter() - began)

    async def _ran_twice(
        self, conn: Connection, key: Key, fence: int, handlers: Sequence[Handler]
    ) -> None:
        """The handlers ran to the end, then the fenced completion was refused. If another
        attempt has completed the key, its handlers ran to the end twice: a double execution.
        The fence rolled back this attempt's writes through ``tx``; nothing else it did."""
        try:
            receipt = await ledger.lookup(conn, key)
        except StoreUnavailable:
            return
        if receipt is None or receipt.state is not State.COMPLETED:
            return
        evidence = "external" if _external(handlers) else "fenced"
        logger.error(
            "ALERT: double execution: the handlers ran to the end twice for one key "
            "(%s: this attempt was fenced out after another completed it)",
            evidence,
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
        )
        if self.metrics is not None:
            self.metrics.double_execution(key.provider, evidence)

    async def _failed(self, conn: Connection, key: Key, fence: int, exc: Exception) -> Reply:
        """The handlers raised or answered 5xx: their transaction rolled back; release the key
        so that the sender's retry runs them again, and keep the error."""
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
                exc_info=not isinstance(exc, _Retryable),
            )
        await ledger.release(conn, key, fence, message, self.clock())
        if isinstance(exc, _Retryable) and exc.response.status == 429:
            return Reply(replay(exc.response, replayed=False), Outcome.HANDLER_FAILED, fence)
        response = error(500, "handler_failed", "the handler failed; retry later")
        return Reply(response, Outcome.HANDLER_FAILED, fence)

    async def _recover_external(self, conn: Connection, job: _Job, receipt: Receipt) -> Reply:
        """An attempt with external effects died or stalled. Never re-run it blindly: each
        external handler's reconcile() asks the outside world what happened."""
        key = job.claim.key
        fence = await ledger.reclaim(conn, job.claim, receipt.fence)
        if fence is None:
            return self._in_flight(receipt, job.claim.now)
        externals = [h for h in job.handlers if h.effects == "external"]
        event = _with_fence(job.event, fence, self._extender(conn, key, fence))
        if any(h.reconcile is None for h in externals):
            reason = (
                "an attempt of an external handler without reconcile() was interrupted: it may "
                "or may not have acted; check the outside system, then `receiver replay`"
            )
            await needs_review(conn, key, fence, _NEEDS_REVIEW, reason, self.clock(), self.metrics)
            return Reply(replay(_NEEDS_REVIEW, replayed=False), Outcome.NEEDS_REVIEW, fence)
        try:
            results = [await h.reconcile(event) for h in externals if h.reconcile is not None]
        except Exception as exc:
            return await self._failed(conn, key, fence, exc)
        if any(isinstance(r, RunAgain) for r in results):
            return await self._run(conn, job, fence)
        # The external effects happened; the transactional handlers' writes died with the
        # interrupted transaction, so they run again, and the reconciled answer is stored.
        answer = next((r for r in reversed(results) if r is not None), None)
        transactional = [h for h in job.handlers if h.effects == "transactional"]
        return await self._run(conn, job, fence, handlers=transactional, answer=encode(answer))

    def _extender(self, conn: Connection, key: Key, fence: int) -> Callable[[float], Any]:
        async def extend(seconds: float) -> None:
            until = self.clock() + seconds
            if self.store.dialect == "sqlite":
                # The handler's transaction holds SQLite's only write lock, so no other attempt
                # can take the key over before it ends anyway; extend within it.
                await ledger.extend_lease(conn, key, fence, until)
                return
            # A separate connection: an update inside the handler's own transaction would stay
            # invisible to other attempts until it committed, which is too late to help.
            async with self.store.acquire() as other:
                await ledger.extend_lease(other, key, fence, until)

        return extend


def _log(
    provider: str,
    webhook_id: str | None,
    event_type: str | None,
    reply: Reply,
    started: float,
    headers: Headers,
) -> None:
    """One structured line per decision. Never the body, a secret or a signature."""
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        "delivery %s",
        reply.outcome.value,
        extra={
            "provider": provider,
            "webhook_id": webhook_id,
            "event_type": event_type or None,
            "outcome": reply.outcome.value,
            "status": reply.response.status_code,
            "fence": reply.fence,
            "check": reply.detail if reply.outcome is Outcome.REJECTED else None,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "request_id": headers.get("x-kong-request-id") or headers.get("x-request-id"),
        },
    )


def _external(handlers: Sequence[Handler]) -> bool:
    return any(h.effects == "external" for h in handlers)


def _datetime(timestamp: int | None) -> dt.datetime | None:
    if timestamp is None:
        return None
    try:
        return dt.datetime.fromtimestamp(timestamp, dt.UTC)
    except (OverflowError, OSError, ValueError):  # past year 9999: verified, but unrepresentable
        return None


def _with_fence(event: Event, fence: int, extend: Callable[[float], Any]) -> Event:
    return dataclasses.replace(event, fence=fence, _extend=extend)


def _final(stored: StoredResponse, key: Key) -> StoredResponse:
    """Apply the rules for what a handler may answer."""
    if stored.status >= 500 or stored.status == 429:
        raise _Retryable(stored)
    if stored.status == 410:
        # Standard Webhooks senders disable the endpoint on 410: never send it.
        logger.warning(
            "handler answered 410; sent as 400 so the sender does not disable the endpoint",
            extra={"provider": key.provider, "webhook_id": key.webhook_id},
        )
        return StoredResponse(400, stored.content_type, stored.body)
    return stored
