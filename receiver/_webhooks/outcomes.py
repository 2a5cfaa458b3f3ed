"""How a delivery ends: its :class:`Outcome`, the :class:`Reply` that carries the response,
and the rules for what a handler may answer.

Every path of the pipeline (inline, queued, recovery, replay) ends in one :class:`Reply`;
metrics and logs report its outcome, and :func:`log_reply` writes the one line per decision.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import Response

from .._ledger.receipts import Key, StoredResponse
from .._logging import get_logger

logger = get_logger("receiver")


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
    QUEUED = "queued"  # recorded for the workers and answered 202 (queued mode)
    DEAD_LETTER = "dead_letter"  # a queued receipt's last attempt failed (workers only)
    # A queued receipt's handlers answered a final 4xx: failed, not retried (workers only).
    HANDLER_REJECTED = "handler_rejected"
    SHED = "shed"  # answered 503 (or 429) under load before anything was claimed
    HANDED_OFF = "handed_off"  # answered 202 at the sender's limit, finishing in the background


@dataclass(frozen=True, slots=True)
class Reply:
    """How one delivery (or replay) was answered: the response and its `Outcome`."""

    response: Response
    outcome: Outcome
    fence: int | None = None
    detail: str | None = None  # the failed check of a rejection


NEEDS_REVIEW = StoredResponse(
    202,
    "application/json",
    b'{"status":"needs_review","detail":"an attempt with external effects was interrupted '
    b'and cannot be safely re-run; an operator was alerted"}',
)


# What a sender is told when the store fails (the fix is for the operator's logs, not for it).
UNAVAILABLE = {
    "unavailable": "the receipt store is unavailable; retry later",
    "read_only": "the receipt store is read-only (failing over?); retry later",
    "misconfigured": "the receipt store is misconfigured; retry later",
}


class HandlerAnswered(Exception):
    """A handler answered 5xx (or 429): roll back and release, never store it as the truth.
    Its name and message are what ``receiver failed`` shows as the attempt's error."""

    def __init__(self, response: StoredResponse) -> None:
        super().__init__(
            f"HTTP {response.status}, not stored: the claim was released for the sender's retry"
        )
        self.response = response


def final_answer(stored: StoredResponse, key: Key) -> StoredResponse:
    """Apply the rules for what a handler may answer."""
    if stored.status >= 500 or stored.status == 429:
        raise HandlerAnswered(stored)
    if stored.status == 410:
        # Standard Webhooks senders disable the endpoint on 410: never send it.
        logger.warning(
            "handler answered 410; sent as 400 so the sender does not disable the endpoint",
            extra={"provider": key.provider, "webhook_id": key.webhook_id},
        )
        return StoredResponse(400, stored.content_type, stored.body, stored.headers)
    return stored


def log_reply(
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
