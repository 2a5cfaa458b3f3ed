"""Admission control: a bound on the deliveries one process has in progress, and the sender's
time limit as a budget. Both shed a delivery before it claims anything.

Past what a process can finish, admitting more only makes every accepted delivery later: the
work queues for the pool's connections and the CPU, until none is answered within its
sender's limit while the handlers still run for senders that have hung up. So each process
measures, as deliveries finish:

- ``alone``: how long a delivery takes when nothing queues (the moving average of those that
  had fewer others in progress than the pool has connections, from their start to their end);
- ``capacity``: how many deliveries it finishes per second when saturated: counted over the
  time in which at least as many were in progress as the pool has connections, never over idle
  time (a burst of three on a store of one connection is no measure of a low rate), in
  half-second windows whose deliveries queued (took longer than ``alone``); the best such
  window, forgotten slowly: by half in about 15 s;
- ``latency``: how long deliveries take now (a moving average, for the budget and
  ``Retry-After``).

The bound on deliveries in progress is ``capacity * (alone + max_wait)``, never below the pool
size: by Little's law, what the process finishes in the time a delivery may take, its own work
plus the wait it may face. Until the process has been saturated once, it has no measure of its
capacity and sheds nothing. The capacity is the best rate seen while saturated, not the
current one: a process slowed by something else (a noisy neighbour on its cores) would
otherwise shrink its bound, finish less, shrink it again, and end up refusing what it could
do. A handler that is slow by itself (an external call of a second) raises ``alone`` with it
and is not taken for a queue.

Past the bound a delivery waits up to ``max_wait`` for a place (one that finishes hands its
place to the oldest waiting; at most as many wait as the bound admits); without one in time,
or with as many already waiting, it is answered 503 with ``Retry-After`` (or 429 where the
provider asks for it), before it is verified or claims anything: nothing is half done and the
ledger holds no trace of it, so the sender's retry runs it fresh.

The budget: a sender hangs up after its timeout (Slack 3 s, Shopify 5 s, GitHub 10 s,
receiver/_webhooks/senders.py). A delivery that has already waited so long that it cannot be
finished within what is left (its wait plus the current latency) is not started either:
nobody would read the answer.

Durations are measured with the process's monotonic clock, never the ledger's: they are this
process's own work.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._exceptions import ConfigurationError
from .._ledger.responses import error
from .._ops.metrics import SHED_REASONS
from .outcomes import Outcome, Reply

#: The default wait an admitted delivery may face beyond its own work (seconds): well inside
#: the shortest sender limit (3 s).
DEFAULT_MAX_WAIT = 0.5
#: The bound before the process has measured its capacity, and its ceiling.
MAX_BOUND = 10_000
#: How far each finished delivery moves the latency averages (a fraction).
_ALPHA = 0.05
#: Deliveries finished are counted over windows of this many seconds; the best window's rate
#: is the capacity, which loses this fraction per window (about half in 15 s).
_WINDOW = 0.5
_FORGET = 0.023
#: A window measures the capacity only where its deliveries queued: took this many times as
#: long as one alone (a handler that is slow by itself is no queue).
_QUEUED = 1.1


@dataclass(slots=True)
class Ticket:
    """One admitted delivery: when it was admitted, and how many were in progress then."""

    admitted: float
    ahead: int


class Admission:
    """Counts the deliveries in progress in this process and decides whether one more fits.

    ``limit``: a fixed bound on deliveries in progress, or None to derive it (see the module's
    docstring) from ``pool`` (the store's pool size) and the measured service time, so that an
    admitted delivery waits about ``max_wait`` seconds at most beyond its own work. 0 disables
    admission control: every delivery is admitted, whatever it waited.
    """

    def __init__(
        self,
        *,
        pool: int,
        limit: int | None = None,
        max_wait: float = DEFAULT_MAX_WAIT,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if isinstance(limit, bool) or (limit is not None and not isinstance(limit, int)):
            raise ConfigurationError(
                f"max_in_progress must be a number of deliveries, 0 (no bound) or None "
                f"(adapted to the measured latency), not {limit!r}"
            )
        if limit is not None and limit < 0:
            raise ConfigurationError(f"max_in_progress must be >= 0, not {limit}")
        if not (isinstance(max_wait, int | float) and max_wait > 0 and math.isfinite(max_wait)):
            raise ConfigurationError(f"max_queue_wait must be positive seconds, not {max_wait!r}")
        self.pool = max(1, int(pool))
        self.limit = limit
        self.max_wait = float(max_wait)
        self.clock = clock
        self.in_progress = 0
        #: Seconds a delivery takes now, and when nothing queues (None until one finished).
        self.latency: float | None = None
        self.alone: float | None = None
        #: The most deliveries finished per second lately (None until a window has passed).
        self.capacity: float | None = None
        self._window_start = clock()
        self._window_count = 0
        self._window_took = 0.0
        #: Deliveries finished, and seconds spent, with the pool busy (at least ``pool`` in
        #: progress) in this window; when the pool last became busy (None: it is not now).
        self._busy_count = 0
        self._busy_time = 0.0
        self._busy_since: float | None = None
        #: Deliveries shed by this process, by reason (for the console; the metrics count them
        #: per provider).
        self.shed_total = dict.fromkeys(SHED_REASONS, 0)
        #: Deliveries past the bound waiting for a place, oldest first (at most ``bound``).
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Per whole second of the clock: deliveries admitted and shed (the last minute's).
        self._seconds: collections.deque[list[int]] = collections.deque(maxlen=60)

    @property
    def enabled(self) -> bool:
        return self.limit != 0

    @property
    def bound(self) -> int:
        """How many deliveries may be in progress at once now."""
        if self.limit is not None:
            return self.limit if self.limit > 0 else sys.maxsize
        if self.capacity is None:
            return MAX_BOUND
        fits = self.capacity * ((self.alone or 0.0) + self.max_wait)
        return max(self.pool, min(MAX_BOUND, math.floor(fits)))

    def full(self) -> bool:
        """Whether a delivery arriving now would be shed at once: past the bound, with as many
        already waiting for a place."""
        return self.enabled and self.in_progress >= self.bound and len(self._waiting) >= self.bound

    async def admit(self, patience: float) -> Ticket | None:
        """Admit one delivery, waiting up to ``patience`` seconds for a place when the process
        is at its bound (the bound on the wait: at most as many wait as the bound admits, the
        oldest first); None: shed it. Waiting costs nothing but a held connection, where a
        refusal at once would bring the sender's next request at once."""
        ticket = self.enter()
        if ticket is not None or patience <= 0 or len(self._waiting) >= self.bound:
            return ticket
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(patience):
                await asyncio.shield(waiter)
        except TimeoutError:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
                return None
        # leave() counted this delivery in when it handed it the place.
        now = self.clock()
        self._second(now)[0] += 1
        return Ticket(now, self.in_progress - 1)

    def enter(self) -> Ticket | None:
        """Admit one delivery (a ticket to hand back to :meth:`leave`), or None: past the bound,
        shed it."""
        if self.enabled and self.in_progress >= self.bound:
            return None
        now = self.clock()
        self._count_in(now)
        self._second(now)[0] += 1
        return Ticket(now, self.in_progress - 1)

    def _count_in(self, now: float) -> None:
        self.in_progress += 1
        if self.in_progress >= self.pool and self._busy_since is None:
            self._busy_since = now

    def leave(self, ticket: Ticket) -> None:
        """The delivery is answered: count it out, and adapt the bound to how long it took."""
        now = self.clock()
        crowd = self.in_progress
        busy = self._busy_since is not None
        self.in_progress -= 1
        if busy and self.in_progress < self.pool:
            assert self._busy_since is not None
            self._busy_time += now - self._busy_since
            self._busy_since = None
        while self._waiting and self.in_progress < self.bound:
            waiter = self._waiting.popleft()
            if not waiter.done():  # hand the place over, counted in now
                self._count_in(now)
                waiter.set_result(None)
        took = max(now - ticket.admitted, 1e-6)
        if ticket.ahead < self.pool and crowd <= self.pool:
            # Fewer in progress than connections from its start to its end: its own work.
            self.alone = took if self.alone is None else self.alone + _ALPHA * (took - self.alone)
        self.latency = (
            took if self.latency is None else self.latency + _ALPHA * (took - self.latency)
        )
        self._window_count += 1
        self._window_took += took
        self._busy_count += busy
        elapsed = now - self._window_start
        if elapsed >= _WINDOW:
            self._measure(now)

    def _measure(self, now: float) -> None:
        """A window has passed: the rate at which the busy pool finished deliveries is the
        capacity, if they queued."""
        if self.capacity is not None:
            self.capacity *= 1 - _FORGET
        busy_time = self._busy_time
        if self._busy_since is not None:  # still busy: count up to now, go on from here
            busy_time += now - self._busy_since
            self._busy_since = now
        queued = self.alone is None or (
            self._window_took >= _QUEUED * self.alone * self._window_count
        )
        # At least a pool's worth finished while busy: fewer are too small a sample.
        if queued and self._busy_count >= max(2, self.pool) and busy_time > 0:
            rate = self._busy_count / busy_time
            self.capacity = rate if self.capacity is None else max(self.capacity, rate)
        self._window_start, self._window_count, self._window_took = now, 0, 0.0
        self._busy_count, self._busy_time = 0, 0.0

    def past_budget(self, waited: float, budget: float | None) -> bool:
        """Whether a delivery that has waited ``waited`` seconds can no longer be answered
        within its sender's ``budget`` (None: the sender's limit is unknown)."""
        if budget is None or not self.enabled:
            return False
        return waited + (self.latency or 0.0) > budget

    def retry_after(self, cap: int) -> int:
        """Seconds to wait before a retry: how long deliveries take now, at least 1, at most
        ``cap``."""
        return max(1, min(cap, math.ceil(self.latency or 0.0)))

    def shed(self, reason: str) -> None:
        self.shed_total[reason] += 1
        self._second(self.clock())[1] += 1

    def _second(self, now: float) -> list[int]:
        """The counters [admitted, shed] of the second ``now`` falls in."""
        second = int(now)
        if not self._seconds or self._seconds[-1][2] != second:
            self._seconds.append([0, 0, second])
        return self._seconds[-1]

    def shed_rate(self) -> tuple[float, float]:
        """Over the last minute: deliveries shed per second, and their share of all arrivals."""
        now = int(self.clock())
        recent = [s for s in self._seconds if now - s[2] < 60]
        admitted = sum(s[0] for s in recent)
        shed = sum(s[1] for s in recent)
        return shed / 60.0, (shed / (shed + admitted) if shed else 0.0)


_DETAILS = {
    "overloaded": "the receiver is at capacity; retry later",
    "past_budget": "this delivery waited past its sender's time limit; retry later",
}


def shed_reply(status: int, reason: str, retry_after: int) -> Reply:
    """The answer to a shed delivery: 503 (or 429) with ``Retry-After``, nothing claimed."""
    response = error(status, reason, _DETAILS[reason], {"retry-after": str(retry_after)})
    return Reply(response, Outcome.SHED, detail=reason)
