"""Retry-After from how long a tool or route usually takes (issue 19, item 10)."""

from __future__ import annotations

from receiver._ops.durations import DEFAULT_RETRY_AFTER, Durations


def test_a_four_second_action_is_retried_in_seconds_not_at_the_end_of_its_lease() -> None:
    durations = Durations()
    for _ in range(5):
        durations.observe("refund", 4.0)
    assert durations.retry_after("refund", elapsed=1.0, lease_left=59.0) == 3
    assert durations.retry_after("refund", elapsed=10.0, lease_left=50.0) == 1  # late: soon


def test_bounded_by_the_lease_and_at_least_a_second() -> None:
    durations = Durations()
    durations.observe("report", 600.0)
    assert durations.retry_after("report", elapsed=0.0, lease_left=30.0) == 30
    durations.observe("ping", 0.01)
    assert durations.retry_after("ping", elapsed=0.0, lease_left=30.0) == 1


def test_unknown_names_get_a_short_default_and_old_names_are_forgotten() -> None:
    durations = Durations(names=2)
    assert durations.retry_after("new", 0.0, 60.0) == DEFAULT_RETRY_AFTER
    for name in ("a", "b", "c"):
        durations.observe(name, 1.0)
    assert durations.typical("a") is None
    assert durations.typical("c") == 1.0


def test_the_average_follows_recent_durations() -> None:
    durations = Durations(weight=0.5)
    durations.observe("t", 10.0)
    durations.observe("t", 2.0)
    assert durations.typical("t") == 6.0
