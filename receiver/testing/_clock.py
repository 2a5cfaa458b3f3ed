"""A fake clock that one test moves by hand, shared by everything that reads the time."""

from __future__ import annotations

import math

from .._exceptions import ReceiverError

#: 2027-01-15 08:00:00 UTC: a fixed, recent instant, so that failures print the same times.
EPOCH = 1_800_000_000.0
#: 9999-12-31T23:59:59 UTC: the last second the stores' timestamps (and datetime) can hold.
_LAST = 253_402_300_799.0


class FakeClock:
    """Unix seconds that only move when the test says so.

    Give the same clock to the Receiver (``Receiver(clock=clock)``: signature tolerance and the
    replay cache), to the store (``SQLiteStore(path, clock=clock)``: leases and expiry) and to
    the `Sender` (the timestamps it signs), so that "three days later"
    means the same thing to all of them.
    """

    __slots__ = ("now",)

    def __init__(self, now: float = EPOCH) -> None:
        # NaN compares false with everything: leases would never expire, nor receipts; a bool
        # is an int, and no test means the time 1.0.
        if isinstance(now, bool) or not isinstance(now, int | float) or not 0 <= now <= _LAST:
            raise ReceiverError(
                f"a fake clock starts at finite unix seconds from 0 to {_LAST:.0f}, not {now!r}"
            )
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time. Time never runs backwards: a
        ledger whose clock did would resurrect expired leases."""
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise ReceiverError(
                f"a fake clock only moves forward, by finite seconds, not {seconds!r}"
            )
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now:.3f})"
