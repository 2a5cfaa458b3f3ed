"""A fake clock that one test moves by hand, shared by everything that reads the time."""

from __future__ import annotations

import math

from .._exceptions import ReceiverError

#: 2027-01-15 08:00:00 UTC: a fixed, recent instant, so that failures print the same times.
EPOCH = 1_800_000_000.0


class FakeClock:
    """Unix seconds that only move when the test says so.

    Give the same clock to the Receiver (``Receiver(clock=clock)``: signature tolerance and the
    replay cache), to the store (``SQLiteStore(path, clock=clock)``: leases and expiry) and to
    the :class:`~receiver.testing.Sender` (the timestamps it signs), so that "three days later"
    means the same thing to all of them.
    """

    __slots__ = ("now",)

    def __init__(self, now: float = EPOCH) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time. Time never runs backwards: a
        ledger whose clock did would resurrect expired leases."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ReceiverError(
                f"a fake clock only moves forward, by finite seconds, not {seconds!r}"
            )
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now:.3f})"
