"""The checks every entry point applies to settings given in code (receiver/_values.py)."""

from __future__ import annotations

import math

import pytest

from receiver import ConfigurationError, IdempotencyKeyMiddleware
from receiver._values import MAX_SECONDS, names, seconds, size


def test_names_reads_a_generator_once_and_keeps_its_items() -> None:
    assert names((n for n in ["a", "b"]), "refused") == ("a", "b")


@pytest.mark.parametrize("value", ["POST", b"POST", 5, None, ["a", 1], [b"a"]])
def test_names_refuses_what_is_not_a_list_of_strings(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^refused$"):
        names(value, "refused")


def test_names_applies_the_callers_rule_to_each_item() -> None:
    with pytest.raises(ConfigurationError, match="patterns"):
        names(["/a", "b"], "patterns", lambda p: p.startswith("/"))


@pytest.mark.parametrize(
    "value", [True, "5", None, math.nan, math.inf, -1, 0, MAX_SECONDS + 1, 10**400, -(10**400)]
)
def test_seconds_refuses_what_no_duration_is(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^ttl "):
        seconds("ttl", value)


def test_seconds_takes_zero_only_where_asked() -> None:
    assert seconds("wait", 0, zero=True) == 0.0
    assert seconds("ttl", 5) == 5.0
    assert isinstance(seconds("ttl", 5), float)


@pytest.mark.parametrize("value", [True, 0, -1, 1.5, "1"])
def test_size_is_a_positive_whole_number(value: object) -> None:
    with pytest.raises(ConfigurationError, match="max_body_size"):
        size("max_body_size", value)


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("never called")


def test_an_integer_past_a_floats_range_is_a_configuration_error() -> None:
    # It was a bare OverflowError ("int too large to convert to float").
    with pytest.raises(ConfigurationError, match="ttl"):
        IdempotencyKeyMiddleware(
            _app, store="sqlite:///:memory:", principal=lambda scope: "p", ttl=10**400
        )
