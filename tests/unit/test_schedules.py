"""Retry schedules, presets, durations and the dedup window derived from them."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver import Provider
from receiver._exceptions import ConfigurationError
from receiver._webhooks.schedules import (
    PRESETS,
    DedupWindow,
    RetrySchedule,
    dedup_window,
    describe,
    exponential,
    format_duration,
    parse_duration,
)

H = 3600.0
D = 86400.0

# --------------------------------------------------------------------------- presets

EXPECTED_SPANS = {
    "svix": 27 * H + 35 * 60 + 5,  # 99305 s
    "standard-webhooks": 75 * H + 35 * 60 + 5,  # 272105 s
    "stripe": 259200.0,  # 3 days
    "github": 259200.0,  # 3 days of manual redelivery
    "shopify": 14400.0,  # 4 hours
    "slack": 360.0,  # immediately, +1 min, +5 min
    "paddle": 259200.0,  # 3 days
    "zoom": 5100.0,  # +5 min, +30 min, +90 min
    "linear": 25260.0,  # +1 min, +1 h, +6 h
    "twilio": 0.0,  # no retries of its own
}


def test_every_preset_has_an_expected_span() -> None:
    assert set(PRESETS) == set(EXPECTED_SPANS)


@pytest.mark.parametrize(("name", "span"), sorted(EXPECTED_SPANS.items()))
def test_preset_span(name: str, span: float) -> None:
    schedule = RetrySchedule.preset(name)
    assert schedule.span == span
    assert schedule.offsets()[-1] == span
    assert schedule.name == name
    assert schedule.delays[0] == 0
    assert schedule.source.startswith(
        (
            "Svix",
            "Standard",
            "Stripe",
            "GitHub",
            "Shopify",
            "Slack",
            "Paddle",
            "Zoom",
            "Linear",
            "Twilio",
        )
    )
    assert "https://" in schedule.source


def test_svix_offsets_match_the_published_schedule() -> None:
    svix = PRESETS["svix"]
    assert svix.attempts == 8
    # "an attempt that fails three times before eventually succeeding will be delivered roughly
    # 35 minutes and 5 seconds following the first attempt"
    assert svix.offsets()[3] == 35 * 60 + 5
    assert svix.span == 99305


def test_standard_webhooks_matches_the_spec_table() -> None:
    offsets = PRESETS["standard-webhooks"].offsets()
    table = ["0s", "5s", "5m 5s", "35m 5s", "2h 35m 5s", "7h 35m 5s", "17h 35m 5s"]
    table += ["31h 35m 5s", "51h 35m 5s", "75h 35m 5s"]
    assert [format_duration(o) for o in offsets] == table


def test_shopify_retries_eight_times_and_slack_three() -> None:
    assert PRESETS["shopify"].attempts == 1 + 8
    assert PRESETS["slack"].attempts == 1 + 3


def test_preset_lookup_normalises_the_name() -> None:
    assert RetrySchedule.preset(" Standard_Webhooks ") is PRESETS["standard-webhooks"]


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        RetrySchedule.preset("paypal")
    message = str(info.value)
    assert "'paypal'" in message
    for name in PRESETS:
        assert name in message


def test_presets_are_read_only() -> None:
    with pytest.raises(TypeError):
        PRESETS["svix"] = PRESETS["slack"]  # type: ignore[index]


# --------------------------------------------------------------------------- RetrySchedule


def test_schedule_normalises_and_reports() -> None:
    schedule = RetrySchedule(delays=[0, 10, 20])  # type: ignore[arg-type]
    assert schedule.delays == (0.0, 10.0, 20.0)
    assert schedule.attempts == 3
    assert schedule.offsets() == (0.0, 10.0, 30.0)
    assert schedule.span == 30.0
    assert hash(schedule) == hash(RetrySchedule(delays=(0.0, 10.0, 20.0)))


def test_jitter_is_a_fraction_that_lengthens_the_span() -> None:
    schedule = RetrySchedule(delays=(0, 100, 200), jitter=0.1)
    assert schedule.span == pytest.approx(330.0)
    assert schedule.offsets() == (0.0, 100.0, 300.0)  # nominal, without jitter


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"delays": ()}, "no attempts"),
        ({"delays": (0, -5)}, "delay #1"),
        ({"delays": (0, math.nan)}, "finite"),
        ({"delays": (0, math.inf)}, "finite"),
        ({"delays": (0, "5s")}, "number of seconds"),
        ({"delays": (0, True)}, "number of seconds"),
        ({"delays": "0,5"}, "list of seconds"),
        ({"delays": (0, 5), "jitter": -0.1}, "jitter"),
        ({"delays": (0, 5), "jitter": 30}, "fraction"),
        ({"delays": (0, 5_000, 300_000, 36_000_000)}, "milliseconds"),
        ({"delays": (0,) + (200 * D,) * 2}, "milliseconds"),
    ],
)
def test_invalid_schedules_are_configuration_errors(
    kwargs: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        RetrySchedule(**kwargs)  # type: ignore[arg-type]


def test_a_single_attempt_is_a_valid_schedule() -> None:
    once = RetrySchedule(delays=(0,))
    assert once.attempts == 1
    assert once.span == 0


def test_from_value() -> None:
    svix = PRESETS["svix"]
    assert RetrySchedule.from_value(svix) is svix
    assert RetrySchedule.from_value("svix") is svix
    assert RetrySchedule.from_value([0, 5, 300]).delays == (0.0, 5.0, 300.0)
    assert RetrySchedule.from_value([0, "5s", "5m"]).delays == (0.0, 5.0, 300.0)
    assert RetrySchedule.from_value("0, 5s, 5m, 1h30m").delays == (0.0, 5.0, 300.0, 5400.0)
    assert RetrySchedule.from_value((0, 5)).name == "custom"


@pytest.mark.parametrize("value", ["no-such-provider", "", [], [0, "soon"], 42, None, b"svix"])
def test_from_value_rejects_garbage(value: object) -> None:
    with pytest.raises(ConfigurationError):
        RetrySchedule.from_value(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- exponential


def test_exponential() -> None:
    schedule = exponential(60, 2, 5)
    assert schedule.delays == (0.0, 60.0, 120.0, 240.0, 480.0)
    assert schedule.span == 900.0
    assert schedule.attempts == 5


def test_exponential_cap_and_jitter() -> None:
    schedule = exponential(1, 10, 6, jitter=0.5, cap=500)
    assert schedule.delays == (0.0, 1.0, 10.0, 100.0, 500.0, 500.0)
    assert schedule.jitter == 0.5
    assert schedule.span == pytest.approx(1111 * 1.5)


def test_exponential_one_attempt_and_huge_counts_stay_finite() -> None:
    assert exponential(5, 2, 1).delays == (0.0,)
    many = exponential(1, 2, 2000, cap=60)
    assert many.attempts == 2000
    assert max(many.delays) == 60


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((60, 2, 0), "attempts"),
        ((60, 2, 2.5), "attempts"),
        ((-1, 2, 3), "base"),
        ((60, 0.5, 3), "factor"),
        ((60, math.nan, 3), "factor"),
        ((1, 10, 400), "milliseconds"),  # uncapped growth runs past any sane span
    ],
)
def test_exponential_rejects(args: tuple[float, float, int], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        exponential(*args)


def test_exponential_refuses_more_attempts_than_it_can_list() -> None:
    # 2**70 attempts never returned: one delay was built per attempt.
    assert exponential(0, 2, 10_000).attempts == 10_000
    with pytest.raises(ConfigurationError, match="at most 10000 attempts"):
        exponential(60, 2, 2**70)


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("5m", 300),
        ("2h", 7200),
        ("3d", 259200),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("27h 35m 5s", 99305),
        ("1d2h3m4s", 93784),
        ("0.5s", 0.5),
        ("1.5h", 5400),
        ("90", 90),
        (" 0 ", 0),
        (90, 90),
        (2.5, 2.5),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "  ", "abc", "5x", "-5", "-5m", "5m1h", "1h1h", "h", "1e3", "nan", "inf", "1,5h"],
)
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"invalid duration|units must go"):
        parse_duration(text)


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, True, None, [5]])
def test_parse_duration_rejects_bad_numbers(value: object) -> None:
    with pytest.raises(ConfigurationError):
        parse_duration(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (5, "5s"),
        (60, "1m"),
        (99305, "27h 35m 5s"),
        (259200, "3d"),
        (86400, "1d"),
        (90000, "25h"),
        (187200, "52h"),
        (3600.5, "1h 0.5s"),
        (0.25, "0.25s"),
        (-300, "-5m"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(1e306, "1e+306s"), (-1e306, "-1e+306s"), (1e12, "1e+12s")]
)
def test_format_duration_is_total(seconds: float, text: str) -> None:
    # Counting milliseconds overflowed past 1.8e305 s: an OverflowError inside an error message.
    assert format_duration(seconds) == text


@pytest.mark.parametrize("ttl", [1e306, 10**400])
def test_a_huge_ttl_is_refused_clearly(ttl: float) -> None:
    with pytest.raises(ConfigurationError, match="ttl"):
        Provider("p", ["whsec_" + "A" * 32], ttl=ttl)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=731 * 86400))
def test_duration_round_trip_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**9))
def test_duration_round_trip_milliseconds(millis: int) -> None:
    seconds = millis / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-6)


# --------------------------------------------------------------------------- dedup window


def test_svix_with_a_day_of_margin_is_52_hours() -> None:
    # 27h 35m 5s + 24h = 51h 35m 5s, rounded up to a whole hour.
    window = dedup_window("svix", provider="svix")
    assert window == DedupWindow(
        provider="svix",
        schedule=PRESETS["svix"],
        span=99305.0,
        margin=86400.0,
        window=52 * H,
    )
    assert window.seconds == 187200
    assert window.as_timedelta() == timedelta(hours=52)
    assert not window.explicit_ttl


@pytest.mark.parametrize(
    ("name", "margin", "hours"),
    [
        ("svix", 0, 28),
        ("standard-webhooks", D, 100),
        ("stripe", D, 96),  # already whole hours: no rounding
        ("stripe", 0, 72),
        ("github", 12 * H, 84),
        ("shopify", D, 28),
        ("slack", 0, 1),
        ("slack", D, 25),
    ],
)
def test_window_rounding(name: str, margin: float, hours: int) -> None:
    assert dedup_window(name, review_margin=margin).window == hours * H


def test_floor_is_a_minimum_and_is_rounded_to_an_hour() -> None:
    assert dedup_window("slack", review_margin=0, floor=7 * D).window == 7 * D
    assert dedup_window("slack", review_margin=0, floor=90 * 60).window == 2 * H
    assert dedup_window("stripe", floor=H).window == 96 * H  # floor below: no effect


def test_zero_span_and_zero_margin_is_still_an_hour() -> None:
    """A 0 s window would forget a delivery before its own attempt ended (issue 14, item 3):
    windows are whole hours, at least one."""
    assert dedup_window([0], review_margin=0).window == 3600


def test_explicit_ttl_shorter_than_the_span_is_an_error_with_numbers() -> None:
    with pytest.raises(ConfigurationError) as info:
        dedup_window("stripe", ttl=H, provider="stripe")
    assert str(info.value) == (
        "provider 'stripe': ttl 1h is 71h shorter than its retry span 3d (schedule 'stripe');"
        " raise ttl to at least 3d or pick another schedule"
    )


def test_explicit_ttl_error_for_svix_names_the_exact_shortfall() -> None:
    with pytest.raises(ConfigurationError) as info:
        dedup_window("svix", ttl=24 * H, provider="acme")
    assert str(info.value) == (
        "provider 'acme': ttl 1d is 3h 35m 5s shorter than its retry span 27h 35m 5s"
        " (schedule 'svix'); raise ttl to at least 27h 35m 5s or pick another schedule"
    )


def test_explicit_ttl_error_rounds_the_suggestion_up() -> None:
    jittery = RetrySchedule(delays=(0, 10, 10.5), jitter=0.1)  # span 22.55 s
    with pytest.raises(ConfigurationError, match="at least 23s"):
        dedup_window(jittery, ttl=1, provider="x")


def test_explicit_ttl_inside_the_margin_is_allowed_and_kept_exactly() -> None:
    window = dedup_window("stripe", ttl=72 * H + 90, provider="stripe")
    assert window.window == 72 * H + 90  # not rounded: the operator chose it
    assert window.margin == 90
    assert window.explicit_ttl
    assert dedup_window("stripe", ttl=72 * H).window == 72 * H  # exactly the span is enough


def test_explicit_ttl_ignores_the_floor() -> None:
    assert dedup_window("slack", ttl=H, floor=7 * D).window == H


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"ttl": 0}, "ttl must be positive"),
        ({"ttl": -1}, "ttl"),
        ({"ttl": math.nan}, "ttl"),
        ({"review_margin": -1}, "review margin"),
        ({"review_margin": math.inf}, "review margin"),
        ({"floor": -1}, "floor"),
        ({"ttl": 259_200_000}, "milliseconds"),
    ],
)
def test_dedup_window_rejects_bad_numbers(kwargs: dict[str, float], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment) as info:
        dedup_window([0], provider="p", **kwargs)
    assert "provider 'p'" in str(info.value)


def test_describe() -> None:
    assert describe(dedup_window("svix", provider="svix")) == {
        "provider": "svix",
        "schedule": "svix (8 attempts)",
        "span": "27h 35m 5s",
        "margin": "1d",
        "window": "52h",
        "source": PRESETS["svix"].source,
    }
    row = describe(dedup_window(exponential(60, 2, 3, jitter=0.1), ttl=2 * H, provider="p"))
    assert row["schedule"] == "exponential(1m x2) (3 attempts), jitter 10%"
    assert row["window"] == "2h (explicit ttl)"
    assert row["span"] == "3m 18s"
    assert row["margin"] == "1h 56m 42s"
    assert row["source"] == "configured"


# --------------------------------------------------------------------------- properties

delays_st = st.lists(
    st.floats(min_value=0, max_value=10 * D, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=12,
)
jitter_st = st.floats(min_value=0, max_value=1, allow_nan=False)
margin_st = st.floats(min_value=0, max_value=30 * D, allow_nan=False)
bump_st = st.floats(min_value=0, max_value=D, allow_nan=False)


def _is_whole_hours(seconds: float) -> bool:
    return seconds % 3600 == 0


@settings(max_examples=300, deadline=None)
@given(delays_st, jitter_st, margin_st)
def test_window_covers_span_plus_margin_in_whole_hours(
    delays: list[float], jitter: float, margin: float
) -> None:
    schedule = RetrySchedule(delays=tuple(delays), jitter=jitter)
    window = dedup_window(schedule, review_margin=margin)
    assert window.window >= schedule.span + margin
    assert window.window >= 3600
    assert window.window == 3600 or window.window - 3600 < schedule.span + margin
    assert _is_whole_hours(window.window)
    assert window.span == schedule.span


@settings(max_examples=300, deadline=None)
@given(delays_st, jitter_st, margin_st, st.data())
def test_window_is_monotone_in_each_delay(
    delays: list[float], jitter: float, margin: float, data: st.DataObject
) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(delays) - 1))
    bump = data.draw(bump_st)
    longer = list(delays)
    longer[index] += bump
    before = dedup_window(RetrySchedule(delays=tuple(delays), jitter=jitter), review_margin=margin)
    after = dedup_window(RetrySchedule(delays=tuple(longer), jitter=jitter), review_margin=margin)
    assert after.window >= before.window


@settings(max_examples=300, deadline=None)
@given(delays_st, jitter_st, margin_st, bump_st)
def test_window_is_monotone_in_the_margin(
    delays: list[float], jitter: float, margin: float, bump: float
) -> None:
    schedule = RetrySchedule(delays=tuple(delays), jitter=jitter)
    before = dedup_window(schedule, review_margin=margin)
    after = dedup_window(schedule, review_margin=margin + bump)
    assert after.window >= before.window


@settings(max_examples=200, deadline=None)
@given(delays_st, margin_st, st.floats(min_value=0, max_value=731 * D, allow_nan=False))
def test_explicit_ttl_is_accepted_exactly_when_it_covers_the_span(
    delays: list[float], margin: float, ttl: float
) -> None:
    schedule = RetrySchedule(delays=tuple(delays))
    if ttl > 0 and ttl >= schedule.span:
        window = dedup_window(schedule, review_margin=margin, ttl=ttl)
        assert window.window == ttl
        assert window.window >= window.span
    else:
        with pytest.raises(ConfigurationError):
            dedup_window(schedule, review_margin=margin, ttl=ttl)
