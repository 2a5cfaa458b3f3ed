"""One delivery as the steps after verification see it: the :class:`Job`, and the handlers'
:class:`~receiver.Event` built from it under an attempt's fence."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers

from .._ledger.receipts import Claim
from .._queue import receipts as queue
from .._verification.payload import Parsed
from .events import Event
from .handlers import Handler
from .handoff import Turn
from .providers import Provider


@dataclass(slots=True)
class Job:
    """Everything about one delivery that the steps after verification need."""

    claim: Claim
    parsed: Parsed
    handlers: Sequence[Handler]
    #: What the handlers' Event carries besides the claim and the payload (the Event itself is
    #: built once the fence is known, by :func:`event_for`).
    headers: Headers | None
    timestamp: int | None
    client: str | None
    #: This process's clock when the delivery arrived: the replay cache's notion of time (the
    #: ledger's own time is the database's, see Store).
    arrived: float
    #: Set by a fresh claim or queued insert: the payload is already in the window under
    #: another webhook-id.
    drift: bool = False
    #: Set when a worker runs a queued receipt: it is finished, retried or failed by the
    #: queue's statements, which keep the sender's stored 202 (receiver/_queue/receipts.py).
    queued: queue.Queued | None = None
    #: Set for an inline delivery that may be handed off at its sender's limit: whether its
    #: sender was told 202 before it finished (receiver/_webhooks/handoff.py).
    turn: Turn | None = None


@dataclass(slots=True)
class Running:
    """A delivery whose handlers this process is running, as this process's clock sees it."""

    payload_hash: bytes
    fence: int
    lease_until: float


def queued_mode(provider: Provider, job: Job) -> bool:
    """Queued mode: chosen by the provider, or by any handler of the event (they run in one
    transaction). A body that does not parse is answered 400 at once, as inline."""
    if job.parsed.problem is not None:
        return False
    return provider.mode == "queued" or any(h.mode == "queued" for h in job.handlers)


def has_external(handlers: Sequence[Handler]) -> bool:
    return any(h.effects == "external" for h in handlers)


def may_share(handlers: Sequence[Handler]) -> bool:
    """Whether a delivery with these handlers may run in a group transaction (a worker's,
    Groups.run): it has handlers, all of them transactional (an external effect
    is never rolled back, so never run again because another delivery failed) and none asking
    for a lease of its own (a long-running handler would hold the group back)."""
    return bool(handlers) and all(
        h.effects == "transactional" and h.lease is None for h in handlers
    )


def identity(handlers: Sequence[Handler]) -> tuple[int, ...]:
    """A key for a delivery's handlers (registered once, they live as long as the receiver)."""
    return tuple(map(id, handlers))


@functools.lru_cache(maxsize=64)
def _datetime(timestamp: int | None) -> dt.datetime | None:
    # Cached: concurrent deliveries carry the same few timestamps (whole seconds), and an
    # aware datetime costs more to build than to look up.
    if timestamp is None:
        return None
    try:
        return dt.datetime.fromtimestamp(timestamp, dt.UTC)
    except (OverflowError, OSError, ValueError):  # past year 9999: verified, but unrepresentable
        return None


def event_for(job: Job, fence: int, extend: Callable[[float], Any]) -> Event:
    """The handlers' view of the delivery, under the attempt's fence."""
    claim = job.claim
    return Event(
        provider=claim.key.provider,
        id=claim.key.webhook_id,
        type=job.parsed.event_type,
        payload=job.parsed.payload,
        body=claim.body,
        headers=job.headers if job.headers is not None else Headers(),
        timestamp=_datetime(job.timestamp),
        fence=fence,
        client=job.client,
        _extend=extend,
    )
