"""The admission bound and the senders' time limits: how the bound is derived from the pool and
the measured service time, when a delivery is past its budget, and where each is configured.
(The shedding itself, against a real store: tests/integration/test_admission.py.)"""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from receiver import ConfigurationError, Provider, Receiver
from receiver._config.loader import load_config
from receiver._webhooks.admission import MAX_BOUND, Admission, Ticket
from receiver._webhooks.schedules import PRESETS
from receiver._webhooks.senders import SENDER_TIMEOUTS

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(admission: Admission, clock: Clock, seconds: float, concurrent: int) -> None:
    """``concurrent`` deliveries admitted together, all done ``seconds`` later."""
    tickets = [admission.enter() for _ in range(concurrent)]
    clock.now += seconds
    for ticket in tickets:
        assert ticket is not None
        admission.leave(ticket)


def steady(admission: Admission, clock: Clock, took: float, concurrent: int, n: int) -> None:
    """``concurrent`` deliveries in progress at a time, each done ``took`` seconds after it was
    admitted, ``n`` times over."""
    in_progress: deque[Ticket] = deque()
    for _ in range(n):
        while len(in_progress) < concurrent:
            ticket = admission.enter()
            if ticket is None:
                break
            in_progress.append(ticket)
        clock.now += took / max(1, len(in_progress))
        if in_progress:
            admission.leave(in_progress.popleft())


class CPU:
    """A process whose deliveries share one CPU: each takes ``work`` seconds of it, so one
    finishes every ``work`` seconds and each takes ``work`` times the number in progress."""

    def __init__(self, admission: Admission, clock: Clock, work: float) -> None:
        self.admission, self.clock, self.work = admission, clock, work
        self.in_progress: deque[Ticket] = deque()

    def run(self, offered: int, n: int) -> None:
        """``offered`` deliveries try to be in progress at once (the shed ones come back at
        once), until ``n`` have finished."""
        for _ in range(n):
            while len(self.in_progress) < offered:
                ticket = self.admission.enter()
                if ticket is None:
                    break
                self.in_progress.append(ticket)
            self.clock.now += self.work
            self.admission.leave(self.in_progress.popleft())


def test_the_bound_keeps_the_process_saturated_and_no_more() -> None:
    clock = Clock()
    admission = Admission(pool=10, max_wait=0.5, clock=clock)
    assert admission.bound == MAX_BOUND  # nothing measured: nothing is shed
    cpu = CPU(admission, clock, 0.01)
    cpu.run(1, 200)  # alone: 10 ms each
    assert admission.alone == pytest.approx(0.01, rel=0.01)
    assert admission.bound == MAX_BOUND  # never saturated: it stays high
    # A flood: a thousand at once, on a process that finishes one every 10 ms. Twice the
    # deliveries one alone needs is 2; the floor, twice the pool, is 20: the rest wait in line.
    cpu.run(1000, 5000)
    assert admission.bound == 20
    assert admission.latency == pytest.approx(0.2, rel=0.1)  # 20 in progress, 10 ms each
    assert admission.alone == pytest.approx(0.01, rel=0.01)  # queued ones do not count
    assert admission.capacity == pytest.approx(100, rel=0.05)
    # The flood is over: what the process can do stays admitted; its capacity is forgotten
    # slowly (a light load is no measure of it).
    cpu.run(5, 500)
    assert admission.bound == 20
    assert 50 < (admission.capacity or 0) < 100


def test_a_fast_process_keeps_20_ms_of_its_work_in_progress() -> None:
    # 5,000 a second, 0.2 ms each: the batches that make a store fast need deliveries side by
    # side, so the bound is 20 ms of work (100), not twice what one alone needs (2).
    clock = Clock()
    admission = Admission(pool=1, max_wait=0.5, clock=clock)
    cpu = CPU(admission, clock, 0.0002)
    cpu.run(1, 200)
    cpu.run(1000, 20_000)
    assert admission.capacity == pytest.approx(5000, rel=0.05)
    assert admission.bound == pytest.approx(100, abs=5)


def test_a_slow_handler_is_not_taken_for_a_queue() -> None:
    clock = Clock()
    admission = Admission(pool=10, max_wait=0.5, clock=clock)
    steady(admission, clock, 1.0, 5, 500)  # an external call of a second, nothing queued
    steady(admission, clock, 1.2, 50, 5000)  # 50 in progress, each a little slower
    # 50 / 1.2 s finished per second, times twice the second one takes alone: room for 83,
    # none of the 50 shed.
    assert admission.bound == pytest.approx(83, abs=2)


def test_bursts_on_one_connection_measure_the_rate_while_busy_not_over_idle_time() -> None:
    # SQLite's one writer: two deliveries at once, done one after another (10 ms each), then
    # a second of nothing, again and again. Counted over the whole window that is two a
    # second; while busy it is 100 a second.
    clock = Clock()
    admission = Admission(pool=1, max_wait=0.5, clock=clock)
    for _ in range(20):
        tickets = [admission.enter() for _ in range(2)]
        assert None not in tickets
        for ticket in tickets:
            assert ticket is not None
            clock.now += 0.01
            admission.leave(ticket)
        clock.now += 1.0
    assert admission.capacity == pytest.approx(100, rel=0.05)
    assert admission.bound == 2  # twice the pool: more of a burst waits in line for a place


def test_handlers_slow_by_themselves_side_by_side_are_no_queue() -> None:
    # External calls of a second each, five at a time on a store of one connection: each takes
    # as long as one alone, so nothing queues and nothing bounds them.
    clock = Clock()
    admission = Admission(pool=1, max_wait=0.5, clock=clock)
    run(admission, clock, 1.0, 1)
    for _ in range(20):
        run(admission, clock, 1.0, 5)
    assert admission.capacity is None
    assert admission.bound == MAX_BOUND


async def test_the_capacity_is_not_forgotten_while_deliveries_wait_for_a_place() -> None:
    # Under a flood the bound limits the rate it is measured from: forgetting the capacity
    # then would shrink the bound, the rate with it, and the bound again, flood-long.
    clock = Clock()
    admission = Admission(pool=10, max_wait=0.5, clock=clock)
    cpu = CPU(admission, clock, 0.01)
    cpu.run(1000, 5000)
    measured = admission.capacity
    assert measured == pytest.approx(100, rel=0.05)
    while admission.enter() is not None:  # at its bound: the next one waits
        pass
    waiting = asyncio.create_task(admission.admit(1000.0))
    await asyncio.sleep(0)
    assert admission.waiting == 1
    for _ in range(60):  # half a minute of windows with the line standing
        clock.now += 0.5
        admission._measure(clock.now)
    assert admission.capacity == measured
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.waiting == 0
    for _ in range(60):  # the same half minute with nobody waiting: forgotten by half and more
        clock.now += 0.5
        admission._measure(clock.now)
    assert (admission.capacity or 0) < measured / 2


def test_past_the_bound_nothing_is_admitted_until_one_leaves() -> None:
    admission = Admission(pool=2, limit=3, clock=Clock())
    tickets = [admission.enter() for _ in range(3)]
    assert None not in tickets
    assert admission.enter() is None
    first = tickets[0]
    assert first is not None
    admission.leave(first)
    assert admission.enter() is not None
    assert admission.in_progress == 3


async def test_a_freed_place_goes_to_the_oldest_then_to_the_newest_once_the_line_stands() -> None:
    # A blip: the oldest has waited less than max_wait and gets the place, first come first
    # served. A standing queue: the oldest has waited max_wait, nearest its sender's limit, and
    # the newest gets the place, while its sender still listens.
    clock = Clock()
    admission = Admission(pool=1, limit=2, max_wait=0.5, clock=clock)
    held = [admission.enter(), admission.enter()]

    async def wait(name: str) -> str:
        assert await admission.admit(10.0) is not None
        return name

    oldest = asyncio.create_task(wait("oldest"))
    await asyncio.sleep(0)
    clock.now += 0.1
    newest = asyncio.create_task(wait("newest"))
    await asyncio.sleep(0)
    first = held.pop()
    assert first is not None
    admission.leave(first)
    assert await asyncio.wait_for(oldest, 1) == "oldest"  # waited 0.1 s: a blip
    again = admission.enter()
    assert again is None  # both places taken: the next one waits too
    later = asyncio.create_task(wait("later"))
    await asyncio.sleep(0)
    clock.now += 0.6  # the queue stands: "newest" has waited 0.6 s
    second = held.pop()
    assert second is not None
    admission.leave(second)
    assert await asyncio.wait_for(later, 1) == "later"
    assert not newest.done()
    assert admission.in_progress == 2
    newest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await newest
    assert admission.in_progress == 2  # a cancelled wait takes no place


async def test_the_line_of_waiting_deliveries_holds_a_bounded_number_of_body_bytes() -> None:
    admission = Admission(pool=1, limit=1, clock=Clock())
    admission.max_waiting_bytes = 100
    ticket = admission.enter()
    assert ticket is not None
    first = asyncio.create_task(admission.admit(10.0, size=60))
    await asyncio.sleep(0)
    assert admission.waiting == 1
    assert await admission.admit(10.0, size=60) is None  # 120 bytes would wait: shed at once
    assert admission.waiting == 1
    assert not first.done()
    admission.leave(ticket)
    assert await asyncio.wait_for(first, 1) is not None
    timed_out = await admission.admit(0.01, size=100)  # the line is empty again
    assert timed_out is None
    assert admission._waiting_bytes == 0
    assert admission.waiting == 0


async def test_a_wait_cancelled_as_its_place_is_handed_over_gives_the_place_back() -> None:
    admission = Admission(pool=1, limit=1, max_wait=0.5, clock=Clock())
    ticket = admission.enter()
    assert ticket is not None
    waiting = asyncio.create_task(admission.admit(10.0))
    await asyncio.sleep(0)
    admission.leave(ticket)  # the place is handed over and counted in ...
    waiting.cancel()  # ... but the request's task is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.in_progress == 0
    assert admission.enter() is not None


def test_a_delivery_is_past_its_budget_when_it_cannot_finish_in_time() -> None:
    clock = Clock()
    admission = Admission(pool=1, clock=clock)
    assert not admission.past_budget(2.9, 3.0)  # nothing measured: only the wait counts
    assert admission.past_budget(3.1, 3.0)
    deliveries(admission, clock, "chat", 0.5, 1)
    assert admission.past_budget(2.6, 3.0, "chat")  # 2.6 s waited + 0.5 s of work > 3 s
    assert not admission.past_budget(2.4, 3.0, "chat")
    assert not admission.past_budget(1e9, None)  # no known limit
    assert admission.retry_after(5) == 1
    for _ in range(100):
        run(admission, clock, 20.0, 1)
    assert admission.retry_after(5) == 5
    assert admission.retry_after(30) == 20  # from how long the work takes, capped


def deliveries(admission: Admission, clock: Clock, provider: str, took: float, n: int) -> None:
    """``n`` deliveries of ``provider``, one after another, each ``took`` seconds long."""
    for _ in range(n):
        ticket = admission.enter(provider)
        assert ticket is not None
        clock.now += took
        admission.leave(ticket)


def test_after_a_slow_spell_a_provider_recovers_by_itself() -> None:
    # Slack's 3 s: a slow spell of deliveries of 3.5 s each takes the provider's measure past
    # its sender's limit. A delivery that has not waited is still started (refused, it would
    # keep the measure there), and normal traffic brings the measure back down.
    clock = Clock()
    admission = Admission(pool=4, clock=clock)
    deliveries(admission, clock, "chat", 3.5, 20)
    assert admission.expected("chat") == pytest.approx(3.5)
    assert not admission.past_budget(0.0, 3.0, "chat")
    assert not admission.past_budget(0.4, 3.0, "chat")  # within the answer's margin (0.5 s)
    assert admission.past_budget(0.6, 3.0, "chat")  # slow, and waited: it cannot be in time
    deliveries(admission, clock, "chat", 0.01, 100)  # normal traffic again
    assert admission.expected("chat") < 0.05
    assert not admission.past_budget(2.0, 3.0, "chat")
    assert admission.past_budget(3.1, 3.0, "chat")  # the limit itself still counts


def test_a_slow_providers_measure_is_forgotten_while_none_of_its_deliveries_finishes() -> None:
    # Deliveries that have all waited a little are refused one after another; no delivery
    # finishes to bring the measure down, so time does.
    clock = Clock()
    admission = Admission(pool=4, clock=clock)
    deliveries(admission, clock, "chat", 3.5, 20)
    assert admission.past_budget(1.0, 3.0, "chat")
    clock.now += 3.5  # a delivery started since may still be running: nothing is forgotten
    assert admission.expected("chat") == pytest.approx(3.5)
    clock.now += 5.0  # then half of it
    assert admission.expected("chat") == pytest.approx(1.75)
    assert admission.past_budget(1.5, 3.0, "chat")
    clock.now += 5.0
    assert not admission.past_budget(1.5, 3.0, "chat")
    ticket = admission.enter("chat")  # one admitted: it goes on from what is left
    assert ticket is not None
    clock.now += 0.01
    admission.leave(ticket)
    assert admission.expected("chat") == pytest.approx(0.875 * 0.95 + 0.05 * 0.01, rel=0.01)


def test_one_providers_slow_deliveries_do_not_shed_anothers() -> None:
    clock = Clock()
    admission = Admission(pool=4, clock=clock)
    deliveries(admission, clock, "hub", 0.05, 20)
    deliveries(admission, clock, "chat", 3.5, 20)
    assert admission.past_budget(1.0, 3.0, "chat")
    assert not admission.past_budget(1.0, 3.0, "hub")  # its own deliveries are fast
    assert not admission.past_budget(2.9, 3.0, "new")  # nothing measured: only the wait counts
    assert admission.past_budget(3.1, 3.0, "new")


def test_a_bound_of_0_admits_everything() -> None:
    admission = Admission(pool=1, limit=0, clock=Clock())
    assert all(admission.enter() is not None for _ in range(10_000))
    assert not admission.past_budget(1e9, 3.0)


@pytest.mark.parametrize(
    "options",
    [
        {"max_in_progress": -1},
        {"max_in_progress": 2.5},
        {"max_queue_wait": 0},
        {"max_queue_wait": True},
    ],
)
def test_bad_admission_settings_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Receiver("sqlite:///x.db", **options)


def test_every_preset_sender_has_a_time_limit_with_its_source() -> None:
    assert set(SENDER_TIMEOUTS) == set(PRESETS)
    for name, limit in SENDER_TIMEOUTS.items():
        assert 0 < limit.seconds <= 30, name
        assert "https://" in limit.source, name
    expected = {"slack": 3, "zoom": 3, "shopify": 5, "github": 10, "svix": 15, "stripe": 20}
    for name, seconds in expected.items():
        assert Provider("p", [SECRET], schedule=name).timeout == seconds
    assert Provider("p", [SECRET], schedule=[0, 60]).timeout is None  # custom: unknown
    assert Provider("p", [SECRET], timeout=7).timeout == 7.0
    assert Provider("p", [SECRET], timeout=None).timeout is None
    for bad in (0, -1, "soon", True, float("inf")):
        with pytest.raises(ConfigurationError, match="timeout"):
            Provider("p", [SECRET], timeout=bad)
    with pytest.raises(ConfigurationError, match="shed_status"):
        Provider("p", [SECRET], shed_status=500)


def test_the_configuration_file_sets_them(tmp_path: Path) -> None:
    path = tmp_path / "receiver.toml"
    path.write_text(
        "max_in_progress = 64\nmax_queue_wait = 0.25\n"
        '[providers.chat]\nscheme = "slack"\nsecrets_env = ["S"]\nshed_status = 429\n'
        '[providers.hub]\nscheme = "github"\nsecrets_env = ["G"]\ntimeout = "8s"\n'
        '[providers.own]\nsecrets_env = ["O"]\ntimeout = false\n'
    )
    config = load_config(path)
    assert (config.max_in_progress, config.max_queue_wait) == (64, 0.25)
    timeouts = {p.name: (p.timeout, p.shed_status) for p in config.providers}
    assert timeouts == {"chat": (3.0, 429), "hub": (8.0, 503), "own": (None, 503)}
    rx = config.receiver(environ={"S": "8f742231b10e8888abcd99yyyzzz85a5", "G": "g", "O": SECRET})
    assert (rx.admission.limit, rx.admission.max_wait) == (64, 0.25)
    assert rx.providers["chat"].shed_status == 429
    assert rx.providers["hub"].timeout == 8.0
    for bad in ("max_in_progress = -1\n", "max_in_progress = true\n", "max_queue_wait = 0\n"):
        path.write_text(bad + '[providers.own]\nsecrets_env = ["O"]\n')
        with pytest.raises(ConfigurationError, match="max_"):
            load_config(path)
    path.write_text('[providers.own]\nsecrets_env = ["O"]\nshed_status = 500\n')
    with pytest.raises(ConfigurationError, match="503 or 429"):
        load_config(path)
