"""The settings the Idempotency-Key middleware and the idempotency proxy share, checked where
they are given: a string where a list belongs would be read as its letters, a generator would
be used up by the check, NaN passes every comparison, a bool is an int, and a duration past
two years overflows the database's timestamps on the first request."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from .._exceptions import ConfigurationError
from .._values import MAX_SECONDS, names
from .._values import seconds as seconds
from .._values import size as size
from .._values import sweep_interval as sweep_interval

#: The longest ``ttl`` (as a provider's dedup window, receiver/_webhooks/timespans.py).
MAX_TTL = MAX_SECONDS


def methods_of(methods: Iterable[str]) -> frozenset[str]:
    refused = f"methods= takes a list of HTTP methods, such as ['POST'], not {methods!r}"
    listed = names(methods, refused, lambda m: m.isascii() and m.replace("-", "").isalpha())
    if not listed:
        raise ConfigurationError(refused)
    return frozenset(m.upper() for m in listed)


def patterns_of(
    paths: Iterable[str] | None, required: Iterable[str]
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """``paths`` and ``required``: path patterns, each an exact path, a prefix ending in
    ``/*``, or ``*``; every required pattern within ``paths``."""
    found: list[tuple[str, ...] | None] = []
    for name, given in (("paths", paths), ("required", required)):
        if given is None:
            found.append(None)
            continue
        refused = (
            f"{name}= takes a list of path patterns, each '/exact', '/prefix/*' or '*', "
            f"not {given!r}"
        )
        found.append(
            names(given, refused, lambda p: p == "*" or (p.startswith("/") and p.isprintable()))
        )
    kept, needed = found[0], found[1] or ()
    outside = [r for r in needed if kept is not None and not matches(kept, r)]
    if outside:
        # Requests there are never seen, so "required" could not mean anything.
        raise ConfigurationError(
            f"required= names paths outside paths= ({', '.join(outside)}): those requests "
            "would run without a key; add them to paths= (or leave paths= unset)"
        )
    return kept, needed


def matches(patterns: Iterable[str], path: str) -> bool:
    return any(
        path == p or (p.endswith("/*") and path.startswith(p[:-1])) or p == "*" for p in patterns
    )


def namespace_of(namespace: Any) -> str:
    if not (isinstance(namespace, str) and 0 < len(namespace) <= 64 and namespace.isprintable()):
        raise ConfigurationError(f"namespace must be 1-64 printable characters, not {namespace!r}")
    return namespace


def check_principal(principal: Any) -> None:
    if not callable(principal):
        raise ConfigurationError(
            "principal= must be a function of the ASGI scope returning who sent the request (a "
            "tenant or client id), so that clients never share keys"
        )


def unstored_statuses_of(statuses: Collection[int]) -> frozenset[int]:
    """``unstored_statuses``: 4xx statuses given back like a 5xx, not stored (a 5xx never is;
    a 2xx or 3xx is the endpoint's work done, so it always is)."""
    refused = f"unstored_statuses= takes a list of 4xx statuses, such as [422], not {statuses!r}"
    if isinstance(statuses, str | bytes) or not isinstance(statuses, Collection):
        raise ConfigurationError(refused)
    found = frozenset(statuses)
    if any(isinstance(s, bool) or not isinstance(s, int) or not 400 <= s <= 499 for s in found):
        raise ConfigurationError(refused)
    return found
