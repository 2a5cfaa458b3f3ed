"""Handler registration and lookup by event type."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from .._exceptions import ConfigurationError
from .._store.base import Connection
from .events import Event

HandlerFunc = Callable[[Event, Connection], Awaitable[Any]]
ReconcileFunc = Callable[[Event], Awaitable[Any]]
Effects = Literal["transactional", "external"]
#: ``inline``: run while the sender waits; ``queued``: answer 202 and run on a worker.
Mode = Literal["inline", "queued"]

# An exact type ("invoice.paid"), a prefix pattern ("invoice.*", or "orders/*" for Shopify's
# topics) or everything ("*").
_PATTERN = re.compile(r"\*|[^*\s]+([./]\*)?")


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler.

    ``effects="transactional"`` (the default) promises that the handler acts only through
    ``tx``: after a crash it is simply run again, because nothing of the dead attempt committed.
    ``effects="external"`` handlers call the outside world; after a crash they are never re-run
    blindly: ``reconcile(event)`` decides, or the receipt is marked failed for a person to look at.
    """

    pattern: str
    func: HandlerFunc
    provider: str | None = None
    effects: Effects = "transactional"
    reconcile: ReconcileFunc | None = None
    lease: float | None = None
    mode: Mode = "inline"

    def matches(self, provider: str, event_type: str) -> bool:
        if self.provider is not None and self.provider != provider:
            return False
        if self.pattern == "*":
            return True
        if self.pattern.endswith("*"):
            return event_type.startswith(self.pattern[:-1])
        return event_type == self.pattern

    @property
    def specificity(self) -> int:
        """Exact types first, then prefix patterns (longer first), then "*"."""
        if self.pattern == "*":
            return 0
        if self.pattern.endswith("*"):
            return len(self.pattern)
        return 1 << 30


class Registry:
    """The handlers of one Receiver, in registration order."""

    def __init__(self) -> None:
        self._handlers: list[Handler] = []

    def add(
        self,
        pattern: str,
        func: HandlerFunc,
        *,
        provider: str | None = None,
        effects: Effects = "transactional",
        reconcile: ReconcileFunc | None = None,
        lease: float | None = None,
        mode: Mode = "inline",
    ) -> Handler:
        if not _PATTERN.fullmatch(pattern):
            raise ConfigurationError(
                f"invalid event type pattern {pattern!r}: use an exact type such as "
                "'invoice.paid', a prefix such as 'invoice.*' (or 'orders/*'), or '*'"
            )
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError(
                f"handler {_name(func)} must be an 'async def' function taking (event, tx)"
            )
        if effects not in ("transactional", "external"):
            raise ConfigurationError(
                f"effects must be 'transactional' or 'external', not {effects!r}"
            )
        if reconcile is not None:
            if effects != "external":
                raise ConfigurationError(
                    f"reconcile= only applies to effects='external' handlers ({_name(func)})"
                )
            if not inspect.iscoroutinefunction(reconcile):
                raise ConfigurationError(f"reconcile {_name(reconcile)} must be 'async def'")
        if lease is not None and (
            isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0
        ):
            raise ConfigurationError(f"lease of {_name(func)} must be positive, not {lease!r}")
        if mode not in ("inline", "queued"):
            raise ConfigurationError(
                f"mode of {_name(func)} must be 'inline' or 'queued', not {mode!r}"
            )
        for existing in self._handlers:
            if (
                existing.func is func
                and existing.pattern == pattern
                and existing.provider == provider
            ):
                raise ConfigurationError(
                    f"handler {_name(func)} is already registered for {pattern!r}"
                )
        handler = Handler(pattern, func, provider, effects, reconcile, lease, mode)
        self._handlers.append(handler)
        self.match.cache_clear()
        return handler

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one registry per app, lives as long
    def match(self, provider: str, event_type: str) -> tuple[Handler, ...]:
        """The handlers for one event, in the order they run."""
        found = [h for h in self._handlers if h.matches(provider, event_type)]
        # sorted() is stable: registration order is kept among equally specific patterns.
        return tuple(sorted(found, key=lambda h: -h.specificity))

    def __iter__(self) -> Any:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", repr(func))
