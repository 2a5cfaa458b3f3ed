"""The queued mode's retry schedule: exponential up to the cap, jitter within its bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver import Backoff, ConfigurationError

schedules = st.builds(
    Backoff,
    attempts=st.integers(1, 50),
    base=st.floats(0.01, 100),
    cap=st.floats(100, 100_000),
    jitter=st.floats(0, 0.99),
)


@settings(max_examples=200)
@given(schedules, st.integers(1, 200), st.floats(0, 1))
def test_delays_grow_to_the_cap_and_jitter_stays_within_bounds(
    backoff: Backoff, failed: int, rand: float
) -> None:
    nominal = backoff.nominal(failed)
    following = backoff.nominal(failed + 1)
    assert following >= nominal  # never shorter
    if nominal < backoff.cap:
        assert following > nominal  # strictly longer until the cap
        assert following == pytest.approx(min(backoff.cap, nominal * 2))
    assert nominal <= backoff.cap
    delay = backoff.delay(failed, lambda: rand)
    assert nominal * (1 - backoff.jitter) - 1e-9 <= delay <= nominal


@settings(max_examples=50)
@given(schedules)
def test_the_last_attempt_is_the_configured_one(backoff: Backoff) -> None:
    assert not any(backoff.is_last(n) for n in range(1, backoff.attempts))
    assert backoff.is_last(backoff.attempts)


def test_the_defaults_are_the_documented_ones() -> None:
    backoff = Backoff()
    assert (backoff.attempts, backoff.base, backoff.cap, backoff.jitter) == (10, 10.0, 3600.0, 0.5)
    assert [backoff.nominal(n) for n in range(1, 10)] == [
        10,
        20,
        40,
        80,
        160,
        320,
        640,
        1280,
        2560,
    ]


@pytest.mark.parametrize(
    "options",
    [
        {"attempts": 0},
        {"attempts": 1.5},
        {"base": 0},
        {"base": float("nan")},
        {"cap": 1.0, "base": 2.0},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"base": True},  # a bool is an int: True seconds is always a mistake
        {"cap": True, "base": 0.5},
        {"jitter": False},
    ],
)
def test_bad_schedules_are_refused_at_start_up(options: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**options)  # type: ignore[arg-type]
