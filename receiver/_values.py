"""Settings given in code, checked where they are given, by every entry point alike.

What each check refuses was accepted once and failed later, on a request: a string where a
list belongs is read as its letters (``methods="POST"`` keyed nothing), a generator is used up
by the check that reads it, NaN passes every comparison, a bool is an int (``True`` as one
second is always a mistake), and a duration past two years overflows the database's
timestamps on the first request.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ._exceptions import ConfigurationError

#: The longest duration a setting may name: a key, receipt or window kept longer would outlive
#: any sender's or client's retries, and a day written in milliseconds (86,400,000 s) is caught.
MAX_SECONDS = 731 * 86_400.0


def seconds(name: str, value: Any, *, zero: bool = False) -> float:
    """A duration: a finite number of seconds above 0 (or 0, with ``zero``), at most
    :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} is a finite number of seconds, not {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        number = math.inf
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} is a finite number of seconds, not {value!r}")
    if number < 0 or (number == 0 and not zero) or number > MAX_SECONDS:
        low = "0 or more" if zero else "above 0"
        raise ConfigurationError(
            f"{name} must be {low} and at most {MAX_SECONDS:.0f} s, not {value!r}"
        )
    return number


def sweep_interval(value: Any) -> float | None:
    """A background sweeper's period: seconds (at most two years), or None for none."""
    return None if value is None else seconds("sweep_interval", value)


#: The most of anything counted (a worker's concurrency, a sweep's batch), as the CLI's
#: counts: the statements' LIMITs are bigints (past 64 bits the driver refused the statement,
#: on every fetch), and nothing here needs more than 32 bits.
MAX_COUNT = 2**31 - 1


def count(name: str, value: Any) -> int:
    """A whole number from 1 to :data:`MAX_COUNT`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_COUNT:
        raise ConfigurationError(
            f"{name} must be a whole number from 1 to {MAX_COUNT}, not {value!r}"
        )
    return value


def size(name: str, value: Any) -> int:
    """A positive whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive whole number of bytes, not {value!r}")
    return value


def names(
    value: Any, refused: str, valid: Callable[[str], bool] = lambda _: True
) -> tuple[str, ...]:
    """A list of strings, each ``valid``: read once (a generator is consumed here, and its items
    kept), never a bare string. Anything else raises ConfigurationError(``refused``)."""
    if isinstance(value, str | bytes):
        raise ConfigurationError(refused)
    try:
        listed = tuple(value)
    except TypeError:
        raise ConfigurationError(refused) from None
    if not all(isinstance(item, str) and valid(item) for item in listed):
        raise ConfigurationError(refused)
    return listed
