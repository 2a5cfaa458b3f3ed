"""One delivery, step by step: verify, parse, claim, decide, run, answer.

This module is the whole behaviour of DESIGN.md "One delivery, step by step". The order is the
guarantee: nothing touches the store before verification passes (I5), and no handler runs
without a claim of its key (I1).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.responses import Response

from . import _ledger as ledger
from ._events import Event
from ._exceptions import LeaseLost, StoreUnavailable, VerificationError
from ._handlers import Handler, Registry
from ._ledger import Claim, Decision, Key, Receipt, State, StoredResponse
from ._providers import Provider
from ._responses import IGNORED, encode, error, replay, stored_error
from ._store import Connection, Store

logger = logging.getLogger("receiver")


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


class _Retryable(Exception):
    """A handler answered 5xx (or 429): roll back and release, never store it as the truth."""

    def __init__(self, response: StoredResponse) -> None:
        super().__init__(f"handler answered {response.status}")
        self.response = response


@dataclass(frozen=True, slots=True)
class Parsed:
    payload: Any
    event_type: str
    payload_hash: bytes
    problem: str | None = None


def parse(body: bytes, event_type: str | None) -> Parsed:
    """Parse the verified body once. The hash is of the normalized payload (sorted keys, no
    insignificant whitespace), so a re-serialized redelivery still matches its receipt."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Parsed(None, "", hashlib.sha256(body).digest(), "the body is not valid JSON")
    if event_type is None:
        event_type = payload.get("type") if isinstance(payload, dict) else None
        if not isinstance(event_type, str) or not event_type:
            return Parsed(
                payload,
                "",
                hashlib.sha256(body).digest(),
                'the body must be a JSON object with a string "type"',
            )
    normalized = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return Parsed(payload, event_type, hashlib.sha256(normalized).digest())


class Pipeline:
    """Processes deliveries for one Receiver."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        clock: Callable[[], float],
        retry_after: int,
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.retry_after = retry_after

    async def deliver(
        self, provider: Provider, headers: Headers, body: bytes, client: str | None = None
    ) -> Response:
        now = self.clock()
        try:
            verified = provider.verifier.verify(headers, body, now)
        except VerificationError as exc:
            logger.info(
                "delivery rejected",
                extra={"provider": provider.name, "outcome": "rejected", "check": exc.check},
            )
            return error(exc.status_code, exc.check, str(exc))
        parsed = parse(body, verified.event_type)
        key = Key(provider.name, verified.webhook_id)
        handlers = () if parsed.problem else self.registry.match(provider.name, parsed.event_type)
        lease = max((h.lease for h in handlers if h.lease), default=provider.lease)
        claim = Claim(
            key,
            parsed.payload_hash,
            parsed.event_type or None,
            body,
            now,
            lease,
            provider.window.window,
        )
        event = Event(
            provider=provider.name,
            id=verified.webhook_id,
            type=parsed.event_type,
            payload=parsed.payload,
            body=body,
            headers=headers,
            timestamp=_datetime(verified.timestamp),
            client=client,
        )
        try:
            async with self.store.acquire() as conn:
                return await self._claim_and_run(conn, claim, parsed, handlers, event)
        except StoreUnavailable as exc:
            logger.warning(
                "store unavailable",
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "error": str(exc)},
            )
            return error(
                503,
                "store_unavailable",
                "the receipt store is unavailable; retry later",
                {"retry-after": str(self.retry_after)},
            )

    async def _claim_and_run(
        self,
        conn: Connection,
        claim: Claim,
        parsed: Parsed,
        handlers: Sequence[Handler],
        event: Event,
    ) -> Response:
        key = claim.key
        for _ in range(3):
            got = await ledger.claim(conn, claim)
            if isinstance(got, int):
                return await self._run(conn, claim, got, parsed, handlers, event)
            receipt = got
            decision = ledger.decide(receipt, claim.payload_hash, claim.now)
            if decision is Decision.REPLAY:
                assert receipt.response is not None
                return replay(receipt.response, replayed=True)
            if decision is Decision.MISMATCH:
                logger.warning(
                    "payload mismatch: same webhook-id, different payload",
                    extra={"provider": key.provider, "webhook_id": key.webhook_id},
                )
                return error(
                    422,
                    "payload_mismatch",
                    "this webhook-id was already received with a different payload",
                )
            if decision is Decision.IN_FLIGHT:
                return self._in_flight(receipt, claim.now)
            if decision is Decision.RECOVER and any(h.effects == "external" for h in handlers):
                return await self._recover_external(conn, claim, receipt, parsed, handlers, event)
            fence = await ledger.reclaim(conn, claim, receipt.fence)
            if fence is not None:
                if decision is Decision.RECOVER:
                    logger.warning(
                        "lease expired; running again under a new fence",
                        extra={"provider": key.provider, "webhook_id": key.webhook_id},
                    )
                return await self._run(conn, claim, fence, parsed, handlers, event)
            # Another attempt reclaimed it between our lookup and our update: look again.
        return error(409, "in_flight", "the delivery is being processed", {"retry-after": "1"})

    def _in_flight(self, receipt: Receipt, now: float) -> Response:
        wait = max(1, math.ceil(receipt.lease_until - now))
        return error(
            409,
            "in_flight",
            "this delivery is being processed by another attempt; retry later",
            {"retry-after": str(min(wait, self.retry_after))},
        )

    async def _run(
        self,
        conn: Connection,
        claim: Claim,
        fence: int,
        parsed: Parsed,
        handlers: Sequence[Handler],
        event: Event,
        *,
        answer: StoredResponse | None = None,
    ) -> Response:
        """Run the handlers and complete the receipt in one transaction, fenced.

        ``answer``, when given (after a reconcile), is stored instead of the handlers' result.
        """
        key = claim.key
        if parsed.problem is not None:
            final = stored_error(400, "invalid_payload", parsed.problem)
            await ledger.complete(conn, key, fence, final, self.clock(), state=State.FAILED)
            return replay(final, replayed=False)
        if not handlers and answer is None:
            await ledger.complete(conn, key, fence, IGNORED, self.clock())
            return replay(IGNORED, replayed=False)
        event = _with_fence(event, fence, self._extender(conn, key, fence))
        try:
            async with conn.transaction():
                result: Any = None
                for handler in handlers:
                    returned = await handler.func(event, conn)
                    if returned is not None:
                        result = returned
                stored = _final(answer or encode(result), key)
                await ledger.complete(conn, key, fence, stored, self.clock())
        except LeaseLost:
            logger.warning(
                "lease lost: a newer attempt owns this delivery; rolled back",
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            )
            return error(
                409, "in_flight", "a newer attempt owns this delivery", {"retry-after": "1"}
            )
        except StoreUnavailable:
            raise
        except Exception as exc:
            return await self._failed(conn, key, fence, exc)
        return replay(stored, replayed=False)

    async def _failed(self, conn: Connection, key: Key, fence: int, exc: Exception) -> Response:
        """The handlers raised or answered 5xx: their transaction rolled back; release the key
        so that the sender's retry runs them again, and keep the error."""
        message = f"{type(exc).__name__}: {exc}"[:2000]
        logger.error(
            "handler failed; claim released",
            extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            exc_info=not isinstance(exc, _Retryable),
        )
        await ledger.release(conn, key, fence, message, self.clock())
        if isinstance(exc, _Retryable) and exc.response.status == 429:
            return replay(exc.response, replayed=False)
        return error(500, "handler_failed", "the handler failed; retry later")

    async def _recover_external(
        self,
        conn: Connection,
        claim: Claim,
        receipt: Receipt,
        parsed: Parsed,
        handlers: Sequence[Handler],
        event: Event,
    ) -> Response:
        """An attempt with external effects died or stalled. Never re-run it blindly: each
        external handler's reconcile() asks the outside world what happened."""
        key = claim.key
        fence = await ledger.reclaim(conn, claim, receipt.fence)
        if fence is None:
            return self._in_flight(receipt, claim.now)
        externals = [h for h in handlers if h.effects == "external"]
        event = _with_fence(event, fence, self._extender(conn, key, fence))
        if any(h.reconcile is None for h in externals):
            logger.error(
                "ALERT: interrupted external handler has no reconcile(); receipt marked failed",
                extra={"provider": key.provider, "webhook_id": key.webhook_id, "fence": fence},
            )
            await ledger.complete(conn, key, fence, _NEEDS_REVIEW, self.clock(), state=State.FAILED)
            return replay(_NEEDS_REVIEW, replayed=False)
        try:
            results = [await h.reconcile(event) for h in externals if h.reconcile is not None]
        except Exception as exc:
            return await self._failed(conn, key, fence, exc)
        if any(isinstance(r, RunAgain) for r in results):
            return await self._run(conn, claim, fence, parsed, handlers, event)
        # The external effects happened; the transactional handlers' writes died with the
        # interrupted transaction, so they run again, and the reconciled answer is stored.
        answer = next((r for r in reversed(results) if r is not None), None)
        transactional = [h for h in handlers if h.effects == "transactional"]
        return await self._run(
            conn, claim, fence, parsed, transactional, event, answer=encode(answer)
        )

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


def _datetime(timestamp: int | None) -> dt.datetime | None:
    if timestamp is None:
        return None
    try:
        return dt.datetime.fromtimestamp(timestamp, dt.UTC)
    except (OverflowError, OSError, ValueError):  # past year 9999: verified, but unrepresentable
        return None


def _with_fence(event: Event, fence: int, extend: Callable[[float], Any]) -> Event:
    return Event(
        provider=event.provider,
        id=event.id,
        type=event.type,
        payload=event.payload,
        body=event.body,
        headers=event.headers,
        timestamp=event.timestamp,
        fence=fence,
        client=event.client,
        _extend=extend,
    )


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
