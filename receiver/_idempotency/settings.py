"""The settings the Idempotency-Key middleware and the idempotency proxy share, checked where
they are given: a string where a list belongs would be read as its letters, a generator would
be used up by the check, NaN passes every comparison, a bool is an int, and a duration past
two years overflows the database's timestamps on the first request."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .._exceptions import ConfigurationError

#: The longest ``ttl``: a key kept past it would outlive any sender's or client's retries
#: (as a provider's dedup window, receiver/_webhooks/providers.py).
MAX_TTL = 731 * 86_400.0


def seconds(name: str, value: Any, *, zero: bool = False) -> float:
    """A duration: a finite number of seconds above 0 (or 0, with ``zero``), at most two years."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{name} is a finite number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not zero) or value > MAX_TTL:
        low = "0" if zero else "above 0"
        raise ConfigurationError(f"{name} must be {low} and at most {MAX_TTL:.0f} s, not {value!r}")
    return float(value)


def size(name: str, value: Any) -> int:
    """A positive whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive whole number of bytes, not {value!r}")
    return value


def sweep_interval(value: Any) -> float | None:
    return None if value is None else seconds("sweep_interval", value)


def methods_of(methods: Iterable[str]) -> frozenset[str]:
    listed = () if isinstance(methods, str) else tuple(methods)
    if not listed or not all(
        isinstance(m, str) and m.isascii() and m.replace("-", "").isalpha() for m in listed
    ):
        raise ConfigurationError(
            f"methods= takes a list of HTTP methods, such as ['POST'], not {methods!r}"
        )
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
        listed = () if isinstance(given, str) else tuple(given)
        if isinstance(given, str) or not all(
            isinstance(p, str) and (p == "*" or p.startswith("/")) for p in listed
        ):
            raise ConfigurationError(
                f"{name}= takes a list of path patterns, each '/exact', '/prefix/*' or '*', "
                f"not {given!r}"
            )
        found.append(listed)
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
