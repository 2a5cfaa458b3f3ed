"""Option values the command line checks as it parses them: a port, a count, a duration. A
value out of range is argparse's one-line error (exit status 2), not a traceback later, nor a
silently different value (port 99999 is not port 34463; a poll interval of 0 spins)."""

from __future__ import annotations

import argparse
import math

#: Counts (limits, batches, workers): a signed 32-bit integer, which every store holds.
MAX_COUNT = 2**31 - 1
#: uvicorn's names, and Python logging's (``trace`` logs as ``debug`` outside uvicorn).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _integer(text: str) -> int:
    if not (text.isascii() and text.strip().lstrip("+-").isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: none, or any free port, as the option says)."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 0 to 65535, not {value}")
    return value


def count(text: str) -> int:
    """A whole number from 1 to 2**31 - 1."""
    value = _integer(text)
    if not 0 < value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_COUNT}, not {value}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


def positive(text: str) -> float:
    """A finite number above zero (seconds, a rate)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def not_negative(text: str) -> float:
    """A finite number, zero or more (seconds where 0 means none)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def log_level(text: str) -> str:
    """One of LOG_LEVELS, in any case."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.lower()
