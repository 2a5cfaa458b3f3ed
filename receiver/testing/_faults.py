"""Faults injected into a user's real handlers: a process dying at a chosen point, or a
handler failing after its work.

A crash is :class:`SimulatedCrash`, a BaseException: nothing in the pipeline catches it, the
open transaction rolls back (as the database does when a connection drops), and no release
runs, so the claim stays in flight until its lease expires: what a SIGKILL leaves behind.
The real kill is tested by the project itself (tests/acceptance/test_crash.py); in-process, the
same ledger state is reached without a second process.

Faults wrap the handlers registered on a Receiver, so the user's code is untouched.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from typing import Any

from .._store.base import Connection
from .._webhooks.app import Receiver
from .._webhooks.events import Event
from .._webhooks.handlers import Handler, HandlerFunc


class Fault(enum.StrEnum):
    """Where an injected fault strikes one delivery."""

    #: The claim committed, then the process died before any handler ran.
    AFTER_CLAIM = "after_claim"
    #: The handlers ran to the end (their ``tx`` writes made), then the process died before the
    #: transaction committed.
    BEFORE_COMMIT = "before_commit"
    #: An ``effects="external"`` handler made its outside call, then the process died before
    #: the result was stored: recovery must reconcile, never re-run blindly.
    AFTER_EXTERNAL_CALL = "after_external_call"
    #: The handlers ran, then raised: the transaction rolls back, the claim is released, the
    #: sender gets 500 and retries.
    HANDLER_ERROR = "handler_error"


class SimulatedCrash(BaseException):
    """The receiving process died here (injected by receiver.testing)."""


class InjectedFailure(Exception):
    """A handler failure injected by receiver.testing."""


class ArmedFaults:
    """Faults armed per key (an action key, an Idempotency-Key), each striking the next attempt
    with that key that reaches the wrapped code: the bookkeeping :class:`ToolFaults` and
    :class:`EndpointFaults` share."""

    def __init__(self) -> None:
        self._armed: dict[str, collections.deque[Fault]] = collections.defaultdict(
            collections.deque
        )

    def arm(self, key: str, fault: Fault) -> None:
        """Make the next attempt with ``key`` that reaches the wrapped code hit ``fault``."""
        self._armed[key].append(Fault(fault))

    def pending(self, key: str) -> bool:
        return bool(self._armed.get(key))

    def disarm(self) -> None:
        self._armed.clear()

    def _take(self, key: str) -> Fault | None:
        """The fault armed first for ``key``, now spent; None if none is."""
        armed = self._armed.get(key)
        return armed.popleft() if armed else None


class Faults:
    """The faults armed on one Receiver, per webhook-id. Install once per Receiver."""

    def __init__(self, rx: Receiver) -> None:
        self._rx = rx
        self._armed: dict[str, collections.deque[Fault]] = collections.defaultdict(
            collections.deque
        )
        # Wrap every registered handler in place; the registry's order is kept.
        registry = rx.registry
        handlers: list[Handler] = registry._handlers
        for index, handler in enumerate(handlers):
            handlers[index] = dataclasses.replace(handler, func=self._wrap(handler.func))
        registry.match.cache_clear()

    @classmethod
    def of(cls, rx: Receiver) -> Faults:
        """The faults of ``rx``, installed on first use."""
        found = getattr(rx, "_testing_faults", None)
        if isinstance(found, Faults):
            return found
        faults = cls(rx)
        rx._testing_faults = faults  # type: ignore[attr-defined]
        return faults

    def arm(self, webhook_id: str, fault: Fault) -> None:
        """Make the next delivery of ``webhook_id`` that runs handlers hit ``fault``."""
        self._armed[webhook_id].append(Fault(fault))

    def pending(self, webhook_id: str) -> bool:
        return bool(self._armed.get(webhook_id))

    def disarm(self) -> None:
        self._armed.clear()

    def _wrap(self, func: HandlerFunc) -> HandlerFunc:
        async def with_faults(event: Event, tx: Connection) -> Any:
            matched = self._rx.registry.match(event.provider, event.type)
            first = bool(matched) and matched[0].func is with_faults
            last = bool(matched) and matched[-1].func is with_faults
            armed = self._armed.get(event.id)
            fault = armed[0] if armed else None
            if fault is Fault.AFTER_CLAIM and first:
                armed.popleft()  # type: ignore[union-attr]
                raise SimulatedCrash(f"{event.id}: died after the claim")
            result = await func(event, tx)
            if fault is not None and fault is not Fault.AFTER_CLAIM and last:
                armed.popleft()  # type: ignore[union-attr]
                if fault is Fault.HANDLER_ERROR:
                    raise InjectedFailure(f"{event.id}: the handler failed after its work")
                raise SimulatedCrash(f"{event.id}: died {fault.value.replace('_', ' ')}")
            return result

        with_faults.__qualname__ = getattr(func, "__qualname__", "handler")
        return with_faults
