"""How long a tool or an endpoint usually takes, for the ``Retry-After`` a duplicate is given.

A duplicate that finds its key in flight is told when to come back. The remaining lease is the
wrong answer (a four-second action would make an obedient agent wait a minute); the right one is
when the attempt holding the key will most likely have finished: how long that tool or route
usually takes (a moving average of this process's recent attempts), less how long the attempt
has already run, never less than a second and never past the lease.
"""

from __future__ import annotations

import collections
import math

#: With no attempt seen yet in this process: a short wait, well inside any lease.
DEFAULT_RETRY_AFTER = 2.0


class Durations:
    """A moving average of recent durations per name (a tool, a route), for a bounded number of
    names (least recently used forgotten first)."""

    def __init__(self, *, weight: float = 0.2, names: int = 1024) -> None:
        self.weight = weight
        self.names = names
        self._typical: collections.OrderedDict[str, float] = collections.OrderedDict()

    def observe(self, name: str, seconds: float) -> None:
        typical = self._typical.pop(name, None)
        seconds = max(0.0, seconds)
        self._typical[name] = (
            seconds if typical is None else typical + self.weight * (seconds - typical)
        )
        while len(self._typical) > self.names:
            self._typical.popitem(last=False)

    def typical(self, name: str) -> float | None:
        return self._typical.get(name)

    def retry_after(self, name: str, elapsed: float, lease_left: float) -> int:
        """Whole seconds until the attempt that has run ``elapsed`` seconds has most likely
        finished: at least 1, at most the lease it still holds (rounded up)."""
        typical = self._typical.get(name)
        wait = DEFAULT_RETRY_AFTER if typical is None else typical - max(0.0, elapsed)
        ceiling = max(1, math.ceil(lease_left))
        return min(ceiling, max(1, math.ceil(wait)))
