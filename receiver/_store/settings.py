"""The stores' own settings, checked where they are given: a pool size or a timeout that is
not a number, a bool (an int: True as one connection or one second is always a mistake), NaN,
infinity or a size no database serves was accepted, then failed on first use or, for
``max_size=2**70``, exhausted memory sizing the pool."""

from __future__ import annotations

from typing import Any

from .._exceptions import ConfigurationError

#: The largest pool: PostgreSQL's own max_connections is rarely past a few thousand.
MAX_POOL = 10_000
#: The longest wait for a connection or a lock: no sender waits an hour for its answer, and
#: SQLite's busy_timeout written in milliseconds (5000) is caught (83 minutes).
MAX_TIMEOUT = 3600.0


def pool_sizes(min_size: Any, max_size: Any) -> tuple[int, int]:
    """``min_size`` and ``max_size`` of a pool: whole numbers, 0 <= min <= max <= MAX_POOL,
    max at least 1 (0 is asyncpg's "open none until needed")."""
    for name, value, low in (("min_size", min_size, 0), ("max_size", max_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_POOL:
            raise ConfigurationError(
                f"{name} must be a whole number of connections from {low} to {MAX_POOL}, "
                f"not {value!r}"
            )
    if min_size > max_size:
        raise ConfigurationError(f"min_size ({min_size}) is more than max_size ({max_size})")
    return min_size, max_size


def timeout(name: str, value: Any, *, zero: bool = False) -> float:
    """A wait in seconds: a finite number above 0 (or 0, with ``zero``: never wait), at most
    MAX_TIMEOUT."""
    number = not isinstance(value, bool) and isinstance(value, int | float)
    # The comparisons refuse NaN and infinity too.
    if not (number and (value >= 0 if zero else value > 0) and value <= MAX_TIMEOUT):
        above = "0 or more" if zero else "above 0"
        raise ConfigurationError(
            f"{name} must be seconds {above} and at most {MAX_TIMEOUT:.0f}, not {value!r}"
        )
    return float(value)
