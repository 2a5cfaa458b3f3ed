"""The event a handler receives."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers


@dataclass(frozen=True, slots=True)
class Event:
    """One verified delivery, as handlers see it.

    ``payload`` is the parsed JSON body and ``body`` the exact bytes that were signed. ``fence``
    is the claim's fencing token: 1 on the first attempt, higher when a later attempt took over
    after a failure or an expired lease.

    :ivar provider: the name of the provider that received it.
    :ivar id: the event's id (the sender's own where it sends one).
    :ivar type: the event's type, as the handlers are registered for (``rx.on(type)``).
    :ivar payload: the parsed JSON body.
    :ivar body: the exact bytes that were signed.
    :ivar headers: the delivery's request headers.
    :ivar timestamp: when the sender signed it, if its scheme signs a time (else None).
    :ivar fence: the claim's fencing token (1 on the first attempt).
    :ivar client: the sender's IP address: the peer's, or the one a trusted proxy forwarded.
    """

    provider: str
    id: str
    type: str
    payload: Any
    body: bytes
    headers: Headers
    timestamp: dt.datetime | None = None
    fence: int = 1
    client: str | None = None
    _extend: Callable[[float], Awaitable[None]] | None = field(
        default=None, repr=False, compare=False
    )

    def idempotency_key(self, action: str = "default") -> str:
        """A key for this event's downstream call ``action``, the same on every attempt.

        Pass it to APIs that accept an idempotency key (Stripe's ``Idempotency-Key``, ...): a
        retried handler then cannot make the downstream system act twice.
        """
        return f"{self.provider}:{action}:{self.id}:v1"

    async def extend_lease(self, seconds: float) -> None:
        """Keep this attempt's claim for ``seconds`` more from now (a long handler calls this
        so that no redelivery takes over). Raises LeaseLost if another attempt already has."""
        if self._extend is not None:
            await self._extend(seconds)
