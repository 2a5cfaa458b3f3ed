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
  window, forgotten slowly (by half in about 15 s) while no delivery waits for a place;
- ``latency``: how long deliveries take now (a moving average, for ``Retry-After``), and
  the same per provider (for its sender's budget, below).

The bound on deliveries in progress is what keeps the process saturated and no more:
``capacity * max(2 * alone, 20 ms)``, never below twice the pool size (see ``_IN_PROGRESS``).
Until the process has been saturated once, it has no measure of its capacity and sheds nothing.
The capacity is the best rate seen while saturated, not the current one: a process slowed by
something else (a noisy neighbour on its cores) would otherwise shrink its bound, finish less,
shrink it again, and end up refusing what it could do. For the same reason it is not forgotten
while deliveries wait for a place: then the bound limits the rate measured, and a capacity
forgotten window by window would take the bound and the rate down together for as long as a
flood lasts. A handler that is slow by itself (an external call of a second) raises ``alone``
with it and is not taken for a queue.

Past the bound a delivery waits for a place (at most ``MAX_WAITING`` of them, holding at most
``MAX_WAITING_BYTES`` of bodies), for as long as its sender's budget allows (``max_wait`` for
a sender without a known limit). A place that frees goes to the oldest waiting while the
oldest has waited less than ``max_wait``; past that the wait is no longer a blip but a
standing queue, and places go to the newest instead (adaptive LIFO): under a flood, first come
first served would serve only deliveries that have waited longest, nearest their sender's
limit, while newest first answers those whose senders still listen, and the oldest run out of
budget. A waiting delivery costs nothing but the connection it holds, and holding it is the
flood's brake: a refusal at once frees the sender's connection for its next request at once,
so refusals would take the process's time from deliveries. One that gets no place within its
budget, or finds the line full, is answered 503 with ``Retry-After`` (or 429 where the
provider asks for it), before it is verified or claims anything: nothing is half done and the
ledger holds no trace of it, so the sender's retry runs it fresh.

The budget: a sender hangs up after its timeout (Slack 3 s, Shopify 5 s, GitHub 10 s,
receiver/_webhooks/senders.py). A delivery that has already waited so long that it cannot be
finished within what is left (its wait plus the time its provider's deliveries take now) is
not started either: nobody would read the answer. The wait is what is judged, never the
handlers' speed alone, since a refusal can only bring an answer sooner when the delivery has
waited. So each provider is judged on its own deliveries (another provider's slow handlers
say nothing of how long this one's take), and its measure counts at most its sender's limit
less the answer's margin (:func:`.handoff.margin`): a delivery that has barely waited is
always started, however slow the provider's last deliveries were. Refused, it would leave the
measure where it is, and every later delivery of the provider (its sender's retries included)
would be refused on the same measure, for as long as the process lives. For the same reason a
provider's measure is forgotten (by half every :data:`_FORGET_HALF_LIFE` seconds) while none
of its deliveries finishes for longer than one takes: deliveries that have all waited a
little, refused one after another, cannot bring it down themselves.

Durations are measured with the process's monotonic clock, never the ledger's: they are this
process's own work.
"""

from __future__ import annotations

import asyncio
import collections
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._exceptions import ConfigurationError
from .._ledger.responses import error
from .._ops.metrics import SHED_REASONS
from .handoff import margin
from .outcomes import Outcome, Reply

#: The default wait an admitted delivery may face beyond its own work (seconds): well inside
#: the shortest sender limit (3 s).
DEFAULT_MAX_WAIT = 0.5
#: The bound before the process has measured its capacity, and its ceiling.
MAX_BOUND = 10_000
#: The most deliveries that may wait for a place, and the most bytes of their bodies: what
#: waiting may hold of the process's memory (a body may be up to ``max_body_size``).
MAX_WAITING = 10_000
MAX_WAITING_BYTES = 64 * 1024 * 1024
#: The derived bound admits what keeps the process saturated, twice the deliveries one alone
#: needs in its own time (Little's law), and at least this many seconds of the process's work:
#: the batches that make a saturated store fast need deliveries side by side. A longer queue
#: belongs in the line of waiting deliveries, not in progress: there each delivery holds a
#: task, a place in the pool's queue and its batch, and on the measurement machine a process
#: with 400 in progress finished a third fewer deliveries per second of CPU than with 64.
_IN_PROGRESS = 0.02
#: How far each finished delivery moves the latency averages (a fraction).
_ALPHA = 0.05
#: Deliveries finished are counted over windows of this many seconds; the best window's rate
#: is the capacity, which loses this fraction per window (about half in 15 s).
_WINDOW = 0.5
_FORGET = 0.023
#: A window measures the capacity only where its deliveries queued: took this many times as
#: long as one alone (a handler that is slow by itself is no queue).
_QUEUED = 1.1
#: A provider's latency is forgotten by half every this many seconds in which none of its
#: deliveries finished (beyond the time one takes), so that refusals alone never keep it up.
_FORGET_HALF_LIFE = 5.0


#: A delivery waiting for a place: since when, its body's size, and the future it waits on.
_Waiting = tuple[float, int, "asyncio.Future[None]"]


@dataclass(slots=True)
class Ticket:
    """One admitted delivery: when it was admitted, how many were in progress then, and its
    provider (None: not a provider's delivery)."""

    admitted: float
    ahead: int
    provider: str | None = None


@dataclass(slots=True)
class _Latency:
    """How long one provider's deliveries take now (a moving average), and when the last one
    finished."""

    seconds: float
    at: float


class Admission:
    """Counts the deliveries in progress in this process and decides whether one more fits.

    ``limit``: a fixed bound on deliveries in progress, or None to derive it (see the module's
    docstring) from ``pool`` (the store's pool size) and the measured service time. 0 disables
    admission control: every delivery is admitted, whatever it waited. ``max_wait``: how long
    the oldest waiting delivery may wait before freed places go to the newest, and the wait
    for a place of a delivery whose sender's limit is unknown.
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
        if isinstance(max_wait, bool) or not (
            isinstance(max_wait, int | float) and max_wait > 0 and math.isfinite(max_wait)
        ):
            raise ConfigurationError(f"max_queue_wait must be positive seconds, not {max_wait!r}")
        self.pool = max(1, int(pool))
        self.limit = limit
        self.max_wait = float(max_wait)
        self.clock = clock
        self.in_progress = 0
        #: Seconds a delivery takes now, and when nothing queues (None until one finished).
        self.latency: float | None = None
        #: Per provider, how long its deliveries take now (its sender's budget).
        self._latencies: dict[str, _Latency] = {}
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
        #: Deliveries past the bound waiting for a place, oldest first (at most ``bound``):
        #: when each began to wait, the size of its body, and what it waits on.
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._waiting_bytes = 0
        self.max_waiting = MAX_WAITING
        self.max_waiting_bytes = MAX_WAITING_BYTES
        #: Per whole second of the clock: deliveries admitted and shed (the last minute's).
        self._seconds: collections.deque[list[int]] = collections.deque(maxlen=60)

    @property
    def enabled(self) -> bool:
        return self.limit != 0

    @property
    def waiting(self) -> int:
        """How many deliveries wait for a place now."""
        return len(self._waiting)

    @property
    def bound(self) -> int:
        """How many deliveries may be in progress at once now."""
        if self.limit is not None:
            return self.limit if self.limit > 0 else sys.maxsize
        if self.capacity is None:
            return MAX_BOUND
        fits = self.capacity * max(2 * (self.alone or 0.0), _IN_PROGRESS)
        return max(2 * self.pool, min(MAX_BOUND, math.floor(fits)))

    def full(self) -> bool:
        """Whether a delivery arriving now would be shed at once: past the bound, with as many
        already waiting as may wait."""
        return (
            self.enabled
            and self.in_progress >= self.bound
            and len(self._waiting) >= self.max_waiting
        )

    async def admit(
        self, patience: float, size: int = 0, provider: str | None = None
    ) -> Ticket | None:
        """Admit one delivery of ``provider`` with a body of ``size`` bytes, waiting up to
        ``patience`` seconds for a place when the process is at its bound (see the module's
        docstring for which of those waiting a freed place goes to); None: shed it."""
        ticket = self.enter(provider)
        if (
            ticket is not None
            or patience <= 0
            or len(self._waiting) >= self.max_waiting
            or self._waiting_bytes + size > self.max_waiting_bytes
        ):
            return ticket
        waiter = asyncio.get_running_loop().create_future()
        entry = (self.clock(), size, waiter)
        self._waiting.append(entry)
        self._waiting_bytes += size
        try:
            async with asyncio.timeout(patience):
                await asyncio.shield(waiter)
        except TimeoutError:
            if not waiter.done():
                self._stop_waiting(entry)
                return None
        except asyncio.CancelledError:
            # The request's task is cancelled (the server shutting down): give up the wait, or
            # the place if it was handed over in the meantime.
            if waiter.done():
                self.in_progress -= 1
                self._hand_over(self.clock())
            else:
                self._stop_waiting(entry)
            raise
        # leave() counted this delivery in when it handed it the place.
        now = self.clock()
        self._second(now)[0] += 1
        return Ticket(now, self.in_progress - 1, provider)

    def enter(self, provider: str | None = None) -> Ticket | None:
        """Admit one delivery of ``provider`` (a ticket to hand back to :meth:`leave`), or None:
        past the bound, shed it."""
        if self.enabled and self.in_progress >= self.bound:
            return None
        now = self.clock()
        self._count_in(now)
        self._second(now)[0] += 1
        return Ticket(now, self.in_progress - 1, provider)

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
        self._hand_over(now)
        took = max(now - ticket.admitted, 1e-6)
        if ticket.ahead < self.pool and crowd <= self.pool:
            # Fewer in progress than connections from its start to its end: its own work.
            self.alone = took if self.alone is None else self.alone + _ALPHA * (took - self.alone)
        self.latency = (
            took if self.latency is None else self.latency + _ALPHA * (took - self.latency)
        )
        if ticket.provider is not None:
            mine = self._latencies.get(ticket.provider)
            if mine is None:
                self._latencies[ticket.provider] = _Latency(took, now)
            else:
                left = self._forgotten(mine, now)
                mine.seconds, mine.at = left + _ALPHA * (took - left), now
        self._window_count += 1
        self._window_took += took
        self._busy_count += busy
        elapsed = now - self._window_start
        if elapsed >= _WINDOW:
            self._measure(now)

    def _stop_waiting(self, entry: _Waiting) -> None:
        entry[2].cancel()
        try:
            self._waiting.remove(entry)
        except ValueError:  # handed over already
            return
        self._waiting_bytes -= entry[1]

    def _hand_over(self, now: float) -> None:
        """Hand the places free under the bound to deliveries waiting for one."""
        while self._waiting and self.in_progress < self.bound:
            _, size, waiter = self._next_waiting(now)
            self._waiting_bytes -= size
            if not waiter.done():  # counted in now, by the place it is handed
                self._count_in(now)
                waiter.set_result(None)

    def _next_waiting(self, now: float) -> _Waiting:
        """The waiting delivery a freed place goes to: the oldest, unless it has waited
        ``max_wait`` already (a standing queue), then the newest."""
        if now - self._waiting[0][0] < self.max_wait:
            return self._waiting.popleft()
        return self._waiting.pop()

    def _measure(self, now: float) -> None:
        """A window has passed: the rate at which the busy pool finished deliveries is the
        capacity, if they queued."""
        if self.capacity is not None and not self._waiting:
            # Forgotten only while no delivery waits for a place: with a line standing, the
            # bound limits the very rate measured here, and forgetting would shrink the bound,
            # then the rate, then the bound again, for as long as the flood lasts.
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

    def expected(self, provider: str | None) -> float:
        """Seconds a delivery of ``provider`` takes now, as its own deliveries measured it
        (forgotten while none finishes; 0 before the first)."""
        mine = None if provider is None else self._latencies.get(provider)
        return 0.0 if mine is None else self._forgotten(mine, self.clock())

    @staticmethod
    def _forgotten(latency: _Latency, now: float) -> float:
        """The measure, less what is forgotten of it: nothing while a delivery started after
        the last one finished may still be running, by half every half-life after that."""
        idle = max(0.0, now - latency.at - latency.seconds)
        return latency.seconds * math.pow(0.5, idle / _FORGET_HALF_LIFE)

    def past_budget(self, waited: float, budget: float | None, provider: str | None = None) -> bool:
        """Whether a delivery of ``provider`` that has waited ``waited`` seconds can no longer
        be answered within its sender's ``budget`` (None: the sender's limit is unknown): its
        wait plus what the provider's deliveries take now, counted at most up to the limit
        less the answer's margin, so that one that has barely waited is always started."""
        if budget is None or not self.enabled:
            return False
        work = min(self.expected(provider), max(0.0, budget - margin(budget)))
        return waited + work > budget

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
