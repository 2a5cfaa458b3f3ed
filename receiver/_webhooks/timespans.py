"""Durations as configuration writes them: seconds (floats) everywhere, and the ``"1h30m"``
strings that configuration files and ``receiver ttl`` use (:func:`parse_duration`,
:func:`format_duration`), each checked to be a plausible number of seconds."""

from __future__ import annotations

import math
import re

from receiver._exceptions import ConfigurationError
from receiver._values import MAX_SECONDS

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

# Margins, floors and TTLs are bounded by MAX_SECONDS (receiver/_values.py): two years of dedup
# retention is odd but conceivable; a day written in milliseconds (about 2.7 years) is not.


def as_seconds(value: object, what: str, *, limit: float = MAX_SECONDS) -> float:
    """Return ``value`` as a finite, non-negative float of seconds, or raise ConfigurationError."""
    # bool is an int; True as "1 second" is always a mistake in a config file.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{what} must be a number of seconds, got {value!r} ({type(value).__name__})"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int past the float range: as infinite as it gets
        seconds = math.inf if value > 0 else -math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    if seconds > limit:
        raise ConfigurationError(
            f"{what} is {format_duration(seconds)}, more than the {format_duration(limit)} limit;"
            " durations are in seconds (were these milliseconds?)"
        )
    return seconds


# Where format_duration stops counting units (about 31,700 years): up to here a float still
# holds every millisecond exactly.
_NO_MILLIS = 1e12

_UNITS = {"d": DAY, "h": HOUR, "m": MINUTE, "s": 1.0}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_COMPONENT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([dhms])")
_DURATION_HELP = "use seconds (90) or units d/h/m/s such as 90s, 5m, 2h, 3d, 1h30m"


def parse_duration(value: str | float) -> float:
    """Seconds in ``value``: a number of seconds, or ``"90s"``, ``"5m"``, ``"2h"``, ``"3d"``,
    ``"1h30m"``, ``"27h 35m 5s"`` (largest unit first, each at most once)."""
    if not isinstance(value, str):
        return as_seconds(value, "duration")
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return as_seconds(float(text), f"duration {value!r}")
    pos = 0
    total = 0.0
    seen: list[str] = []
    while pos < len(text):
        match = _COMPONENT.match(text, pos)
        if match is None:
            raise ConfigurationError(f"invalid duration {value!r}: {_DURATION_HELP}")
        number, unit = match.groups()
        # Units must go strictly from large to small: "5m1h" or "1h1h" is a typo, not a sum.
        if seen and "dhms".index(unit) <= "dhms".index(seen[-1]):
            raise ConfigurationError(
                f"invalid duration {value!r}: units must go from largest to smallest, each once"
            )
        seen.append(unit)
        total += float(number) * _UNITS[unit]
        pos = match.end()
    if not seen:
        raise ConfigurationError(f"invalid duration {value!r}: {_DURATION_HELP}")
    return as_seconds(total, f"duration {value!r}")


def format_duration(seconds: float) -> str:
    """``99305`` -> ``"27h 35m 5s"``; whole days print as days (``259200`` -> ``"3d"``).

    Hours are otherwise the largest unit because windows are whole hours ("52h" reads better than
    "2d 4h" next to a span in hours). Fractions of a second keep millisecond precision.
    """
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds >= _NO_MILLIS:
        # Past it milliseconds are lost, and past about 1.8e305 s counting them overflows:
        # only ever a value being refused (ttl=1e306), said as a number.
        return f"{seconds:.6g}s"
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    if millis % 86_400_000 == 0:
        return f"{millis // 86_400_000}d"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if millis:
        parts.append(f"{secs}.{millis:03d}".rstrip("0") + "s")
    elif secs:
        parts.append(f"{secs}s")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------
# Dedup window
# --------------------------------------------------------------------------------------------
