"""Fingerprints tell numbers apart by their exact decimal value: two JSON documents get one
fingerprint exactly when they are equal as values under the rule of
receiver/_verification/payload.py (``1200``, ``1200.0``, ``1.2e3`` and ``12e2`` are one
number; ``10000000000000001.0`` and ``10000000000000000.0`` are two, beyond a double's
precision). Checked for the webhook path's payload hash, the Idempotency-Key middleware's
fingerprint and the action executor's fingerprint alike."""

from __future__ import annotations

import decimal
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver._actions.action import fingerprint
from receiver._idempotency.middleware import _fingerprint
from receiver._verification.payload import normalized, parse

D = decimal.Decimal


class Number:
    """A JSON number as the rule sees it: its exact value (``integer`` only picks how it is
    usually written)."""

    def __init__(self, integer: bool, value: D) -> None:
        self.integer, self.value = integer, value

    def key(self) -> D:
        return self.value  # Decimal equality is exact: D("1.0") == D(1), D("-0") == D(0)

    def __repr__(self) -> str:
        return f"Number({self.integer}, {self.value!r})"


def comparable(doc: Any) -> Any:
    """The document with numbers replaced by what the rule compares."""
    if isinstance(doc, Number):
        return doc.key()
    if isinstance(doc, dict):
        return {k: comparable(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [comparable(v) for v in doc]
    return doc


def render_number(n: Number, style: int) -> str:
    """One of several texts of the same number: trailing zeros, exponent or plain form, or the
    integer's own digits for an integral value."""
    integral = n.value == n.value.to_integral_value() and n.value.adjusted() < 60
    if integral and (n.integer or style % 4 == 3):
        return str(int(n.value))
    sign, digits, exponent = n.value.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).lstrip("0")
    if text:  # JSON allows no leading zero; trailing ones change only the text
        text += "0" * (style % 3)
        exponent -= style % 3
    else:
        text = "0"
    head = "-" if sign else ""
    if style % 2 or not -40 < exponent < 40:
        return f"{head}{text}{'e' if style % 4 < 2 else 'E'}{exponent}"
    if exponent >= 0:
        return f"{head}{(text + '0' * exponent).lstrip('0') or '0'}.0"
    whole, frac = text[:exponent] or "0", text[exponent:].rjust(-exponent, "0")
    return f"{head}{whole.lstrip('0') or '0'}.{frac}"


def render(doc: Any, styles: st.DataObject) -> str:
    if isinstance(doc, Number):
        return render_number(doc, styles.draw(st.integers(0, 7)))
    if isinstance(doc, dict):
        items = list(doc.items())
        order = styles.draw(st.permutations(items)) if items else items
        space = styles.draw(st.sampled_from(["", " "]))
        inner = f",{space}".join(f'"{k}":{space}{render(v, styles)}' for k, v in order)
        return "{" + inner + "}"
    if isinstance(doc, list):
        return "[" + ",".join(render(v, styles) for v in doc) + "]"
    if isinstance(doc, str):
        return '"' + doc + '"'
    return {True: "true", False: "false", None: "null"}[doc]


INTERESTING = [
    Number(True, D(1)),
    Number(False, D(1)),
    Number(False, D("10000000000000001.0")),
    Number(False, D("10000000000000000.0")),
    Number(False, D("0.1")),
    Number(False, D("0.1000000000000000055511151231257827")),
    Number(True, D(2**64)),
    Number(True, D(2**64 - 1)),
    Number(True, D(-(2**63) - 1)),
    Number(False, D("1e-400")),
    Number(False, D("2e-400")),
    Number(False, D("1.5")),
    Number(False, D("0")),
    Number(False, D("-0")),
    Number(True, D(1234567890123456789)),
]

numbers = st.one_of(
    st.sampled_from(INTERESTING),
    st.integers(-(2**70), 2**70).map(lambda i: Number(True, D(i))),
    st.builds(
        lambda sign, digits, exponent: Number(False, D((sign, digits, exponent))),
        st.integers(0, 1),
        st.lists(st.integers(0, 9), min_size=1, max_size=22).map(tuple),
        st.integers(-330, 250),
    ),
)
documents = st.dictionaries(
    st.sampled_from(["amount", "id", "n"]),
    st.one_of(numbers, st.sampled_from(["x", "y"]), st.lists(numbers, max_size=2)),
    min_size=1,
    max_size=3,
).map(lambda d: {"type": "t", **d})


def webhook_hash(text: str) -> bytes:
    parsed = parse(text.encode(), None)
    assert parsed.problem is None, (parsed.problem, text)
    return parsed.payload_hash


def middleware_hash(text: str) -> bytes:
    scope = {"method": "POST", "path": "/pay", "query_string": b""}
    return _fingerprint(scope, text.encode())


@settings(max_examples=300, deadline=None)
@given(documents, documents, st.data())
def test_one_fingerprint_exactly_when_equal_as_values(a: Any, b: Any, data: st.DataObject) -> None:
    equal = comparable(a) == comparable(b)
    ta, tb = render(a, data), render(b, data)
    for hash_of in (webhook_hash, middleware_hash):
        assert (hash_of(ta) == hash_of(tb)) == equal, (ta, tb, hash_of.__name__)


@settings(max_examples=200, deadline=None)
@given(documents, st.data())
def test_every_text_of_a_document_has_its_fingerprint(doc: Any, data: st.DataObject) -> None:
    first, second = render(doc, data), render(doc, data)
    assert webhook_hash(first) == webhook_hash(second), (first, second)
    assert middleware_hash(first) == middleware_hash(second), (first, second)


@pytest.mark.parametrize(
    "spellings",
    [
        ["1200", "1200.0", "1.2e3", "12e2", "1.200E+3", "120000e-2", "1200.000000000000000000000"],
        ["0", "-0", "0.0", "-0.0", "0e5", "-0E-5"],
        ["18446744073709551615", "18446744073709551615.0", "1.8446744073709551615e19"],
        ["100000000000000000000", "1e20", "100000000000000000000.000"],
        ["-9223372036854775809", "-9.223372036854775809e18"],
        ["0.5", "5e-1", "0.50000000000000000000000"],
    ],
)
def test_every_spelling_of_a_value_is_one_number(spellings: list[str]) -> None:
    for fingerprint_of in (webhook_hash, middleware_hash):
        hashes = {fingerprint_of(f'{{"type": "t", "amount": {text}}}') for text in spellings}
        assert len(hashes) == 1, (spellings, fingerprint_of.__name__)


def test_an_idempotency_key_retry_in_another_language_is_the_same_request() -> None:
    """A JavaScript client retrying a Python client's request writes 1200 for 1200.0."""
    python, javascript = '{"amount": 1200.0}', '{"amount": 1200}'
    assert middleware_hash(python) == middleware_hash(javascript)
    assert middleware_hash(python) != middleware_hash('{"amount": 1200.5}')


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False))
def test_the_executor_compares_numbers_by_value(integer: int, number: float) -> None:
    assert fingerprint({"n": integer}) == fingerprint({"n": float(integer)})
    assert fingerprint({"n": [integer]}) == fingerprint({"n": [float(integer)]})
    exact = D(repr(number))  # the decimal the float's text says
    if exact == exact.to_integral_value() and abs(exact) < 2**63:
        assert fingerprint({"n": number}) == fingerprint({"n": int(exact)})
    assert (fingerprint({"n": number}) == fingerprint({"n": integer})) == (exact == integer)


def test_the_executor_keeps_numbers_beyond_a_double_apart() -> None:
    big = 2**53 + 1
    assert fingerprint({"n": big}) != fingerprint({"n": float(big)})  # 2**53: another value
    assert fingerprint({"n": True}) != fingerprint({"n": 1})


def test_the_issues_amounts_are_two_amounts() -> None:
    a = '{"type": "t", "amount": 10000000000000001.0}'
    b = '{"type": "t", "amount": 10000000000000000.0}'
    assert webhook_hash(a) != webhook_hash(b)
    assert middleware_hash(a) != middleware_hash(b)


def test_fingerprints_of_ordinary_payloads_did_not_change() -> None:
    """Receipts stored before this rule still match their redeliveries: an ordinary payload's
    hash (no number written with a fraction that has an integral value) is the sorted orjson
    form it always was."""
    body = b'{"type":"invoice.paid","amount":12.5,"id":820982911946154508,"n":1}'
    expected = hashlib.sha256(
        b'{"amount":12.5,"id":820982911946154508,"n":1,"type":"invoice.paid"}'
    ).digest()
    assert webhook_hash(body.decode()) == expected


@settings(max_examples=200, deadline=None)
@given(documents, st.data())
def test_a_body_that_spells_a_normalized_form_is_another_request(
    doc: Any, data: st.DataObject
) -> None:
    """A body that is not JSON is fingerprinted as it is; one that spells another body's
    normalized form (the exact forms begin ``receiver:exact-...``) must not match that body."""
    text = render(doc, data).encode()
    scope = {"method": "POST", "path": "/pay", "query_string": b""}
    spelled = normalized(text)[1]
    if spelled.startswith(b"receiver:"):  # a form no JSON text can be
        assert _fingerprint(scope, spelled) != _fingerprint(scope, text)


@pytest.mark.parametrize(
    ("json_body", "raw_body"),
    [
        (
            b'{"amount":100000000000000000000}',
            b'receiver:exact-json:{"amount":100000000000000000000}',
        ),
        (
            b'{"amount":1.00000000000000000001}',
            b'receiver:exact-decimal:{"amount":1.00000000000000000001}',
        ),
    ],
)
def test_a_raw_body_with_the_exact_forms_prefix_is_not_that_payload(
    json_body: bytes, raw_body: bytes
) -> None:
    scope = {"method": "POST", "path": "/pay", "query_string": b""}
    assert _fingerprint(scope, json_body) != _fingerprint(scope, raw_body)
    typed = b'{"type":"t",' + json_body[1:]
    assert parse(typed, None).payload_hash != parse(normalized(typed)[1], None).payload_hash


def test_a_form_and_a_body_spelling_its_normalized_form_are_two_payloads() -> None:
    form = parse(b"a=b&type=t", "t")
    spelled = parse(b'receiver:form:{"a":"b","type":"t"}', "t")
    assert form.problem is None
    assert form.payload_hash != spelled.payload_hash
    # A body hashed as it is keeps the hash it always had, unless it begins "receiver:".
    assert parse(b"plain text", "t").payload_hash == hashlib.sha256(b"plain text").digest()
