"""The normalized payload hash (receiver/_verification/payload.py): distinct payloads never
hash equal, and
re-serialisations of one payload always do, whatever the integers' size, the nesting or the
Unicode; a payload nested too deep is an invalid payload, never an exception."""

from __future__ import annotations

import decimal
import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from receiver._verification.payload import MAX_DEPTH, parse

# Unbounded integers (well past 64 bits), finite floats, every Unicode scalar value except lone
# surrogates (not UTF-8, refused by the parser), nested objects and arrays.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**200)
    | st.integers(min_value=-(2**200), max_value=-(2**62))
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=6), inner, max_size=4
        )
    ),
    max_leaves=20,
)


def event(value: Any) -> dict[str, Any]:
    return {"type": "order.created", "data": value}


def identity(value: Any) -> str:
    """What makes two payloads the same payload: the exact value, numbers by their decimal
    value (1 and 1.0 are one number, -0.0 and 0 too; True is not 1), keys in any order."""

    def by_value(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(decimal.Decimal(repr(v)))
        if isinstance(v, dict):
            return {k: by_value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [by_value(x) for x in v]
        return v

    return json.dumps(by_value(value), sort_keys=True, ensure_ascii=False)


def reserialized(value: Any, rng: random.Random) -> bytes:
    """Another byte sequence for the same payload: shuffled keys, other whitespace, escaped
    non-ASCII characters."""

    def shuffle(v: Any) -> Any:
        if isinstance(v, dict):
            items = list(v.items())
            rng.shuffle(items)
            return {k: shuffle(x) for k, x in items}
        if isinstance(v, list):
            return [shuffle(x) for x in v]
        return v

    return json.dumps(shuffle(value), indent=rng.choice([None, 1, 3]), ensure_ascii=True).encode()


def digest(body: bytes) -> bytes:
    parsed = parse(body, None)
    assert parsed.problem is None, parsed.problem
    return parsed.payload_hash


@settings(max_examples=300, deadline=None)
@given(JSON, JSON)
def test_distinct_payloads_hash_differently(a: Any, b: Any) -> None:
    ha = digest(json.dumps(event(a)).encode())
    hb = digest(json.dumps(event(b)).encode())
    assert (ha == hb) == (identity(event(a)) == identity(event(b)))


@settings(max_examples=200, deadline=None)
@given(JSON, st.randoms(use_true_random=False))
def test_reserialisations_hash_the_same(value: Any, rng: random.Random) -> None:
    first = orjson.dumps(event(value)) if _fits_orjson(value) else json.dumps(event(value)).encode()
    assert digest(reserialized(event(value), rng)) == digest(first)


@settings(max_examples=100, deadline=None)
@given(JSON)
def test_handlers_see_exact_integers(value: Any) -> None:
    parsed = parse(json.dumps(event(value)).encode(), None)
    assert identity(parsed.payload) == identity(event(value))


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=2**64 - 1, max_value=2**300) | st.integers(max_value=-(2**63) - 1))
@example(2**64 - 1)  # the largest orjson keeps exact; its neighbour is not
@example(-(2**63) - 2)  # negative, 19 digits, beyond 64 bits
def test_neighbouring_big_integers_hash_differently(n: int) -> None:
    assert digest(json.dumps(event(n)).encode()) != digest(json.dumps(event(n + 1)).encode())


def test_amounts_beyond_64_bits_hash_differently() -> None:
    one = b'{"type":"payment.created","amount":18446744073709551616}'
    two = b'{"type":"payment.created","amount":18446744073709551617}'
    assert digest(one) != digest(two)
    assert parse(two, None).payload["amount"] == 18446744073709551617


def test_a_long_digit_run_in_a_string_keeps_the_usual_hash() -> None:
    plain = b'{"type":"t","id":"1234567890123456789012"}'
    # The same string with every tenth digit escaped: no run of digits long enough to look
    # like a big integer, so this body takes the fast path and the plain one the exact path.
    escaped = b'{"type":"t","id":"123456789\\u0030123456789\\u003012"}'
    assert json.loads(escaped) == json.loads(plain)
    assert digest(plain) == digest(escaped)


def nested(depth: int) -> bytes:
    return b'{"type":"t","data":' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("depth", [MAX_DEPTH, 300, 1020, 1100, 100_000])
def test_deep_nesting_is_an_invalid_payload(depth: int) -> None:
    parsed = parse(nested(depth), None)
    assert parsed.problem is not None
    assert parsed.event_type == ""


def test_nesting_within_the_limit_parses() -> None:
    assert parse(nested(MAX_DEPTH - 2), None).problem is None


def _fits_orjson(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True
