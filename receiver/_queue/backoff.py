"""Retry schedule of queued deliveries: jittered exponential backoff, then a dead letter.

After the n-th failed attempt (n = 1, 2, ...) the receipt is due again after
``min(cap, base * 2 ** (n - 1))`` seconds, shortened by a random fraction of at most ``jitter``
(so that receipts that failed together, say during a partner's outage, do not all come back in
the same second). After ``attempts`` failed attempts it is failed: a dead letter, kept with
every attempt's error for ``receiver failed`` and ``receiver replay``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from .._exceptions import ConfigurationError


@dataclass(frozen=True, slots=True)
class Backoff:
    """``attempts`` in all (the first included), ``base`` and ``cap`` in seconds, ``jitter`` the
    largest fraction taken off a delay. The defaults span about 1.4 hours over 10 attempts."""

    attempts: int = 10
    base: float = 10.0
    cap: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigurationError(f"retry attempts must be an integer, not {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigurationError(f"retry attempts must be at least 1, not {self.attempts}")
        for name in ("base", "cap"):
            value = getattr(self, name)
            # Not a bool: an int, but True as "1 second" is always a mistake.
            if isinstance(value, bool) or not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ConfigurationError(f"retry {name} must be positive seconds, not {value!r}")
        if self.cap < self.base:
            raise ConfigurationError(
                f"retry cap ({self.cap:g} s) is shorter than its base ({self.base:g} s)"
            )
        if isinstance(self.jitter, bool) or not (
            isinstance(self.jitter, int | float) and 0 <= self.jitter < 1
        ):
            raise ConfigurationError(f"retry jitter must be in [0, 1), not {self.jitter!r}")

    def nominal(self, failed: int) -> float:
        """The delay after the ``failed``-th failed attempt, before jitter."""
        if failed < 1:
            raise ValueError(f"failed attempts count from 1, not {failed}")
        # min() before the power would overflow: 2 ** 1100 floats to inf.
        exponent = min(failed - 1, 64)
        return float(min(self.cap, self.base * 2.0**exponent))

    def delay(self, failed: int, rand: Callable[[], float] = random.random) -> float:
        """The jittered delay: within ``[nominal * (1 - jitter), nominal]``."""
        return self.nominal(failed) * (1.0 - self.jitter * rand())

    def is_last(self, failed: int) -> bool:
        """True when ``failed`` failed attempts exhaust the schedule: the receipt is dead."""
        return failed >= self.attempts
