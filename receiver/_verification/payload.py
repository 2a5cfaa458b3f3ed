"""Parse a verified body once, and hash its normalized payload.

The hash (sha256 of the payload with sorted keys and no insignificant whitespace) decides
whether a redelivery is the same event (replay) or another one under a reused key (422), so it
must tell every two distinct payloads apart and none of a payload's re-serialisations. The
webhook path and the Idempotency-Key middleware share it (:func:`normalized`).

The rule for numbers: two numbers are the same when their exact decimal values are equal,
however they are written (``1200``, ``1200.0``, ``1.2e3`` and ``12e2`` are one number; so are
``0``, ``-0`` and ``0.0``: a JSON client in one language retries what a client in another sent),
and different otherwise: ``10000000000000001.0`` and ``10000000000000000.0`` are two numbers,
though a double cannot tell them apart. A number with an integral value is written as an
integer in the normalized form, every other one as the shortest text that gives it back.

The fast parser (orjson) reads numbers as 64-bit integers and doubles. That is exact for every
integer of up to 19 digits and for every number with at most 15 significant digits and an
exponent of at most two digits, which is nearly every payload. A cheap look at the body finds
the others (a run of 16 digits or dots, a three-digit exponent) and sends them to the standard
library's parser with exact decimals. The exact path writes every number the fast path can
hold exactly the way the fast path does, so that the path a body takes never changes its hash.

A payload nested deeper than orjson serializes (254 levels) cannot be normalized at all: it is
an invalid payload (400, recorded), like a body that is not JSON.

A form body (``application/x-www-form-urlencoded``, as Twilio posts) is a payload too when the
scheme gives the event type (the type is then not read from the body): its payload is a dict of
each name's value (a list of values for a repeated name), hashed in a domain of its own so that
it never equals a JSON payload's hash.

One field of one sender is left out of that sender's payload fingerprints: a top-level integer
``"webhookTimestamp"``, Linear's time of the attempt, inside the signed body and refreshed on
every retry (its SDK refuses one older than a minute). Kept in, every Linear retry would be a
payload mismatch. The scheme names the field (``Linear.attempt_field``, read through
:func:`attempt_field_of`); every other provider's payload is fingerprinted whole, so that two
payloads that differ only in a field of that name are two payloads. The handlers' payload
keeps it.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import orjson

# An event type is a routing key and a stored column: printable, bounded, no control characters
# (PostgreSQL text cannot even hold NUL).
_EVENT_TYPE = re.compile(r"[^\x00-\x1f\x7f]{1,255}")

# The body's shape, for the look: digits and "." become "0", "e"/"E" become "e", signs become
# "-", every other byte a space. One pass in C (about 1 us for 1 KB, where a regular expression
# takes 25 us); a false alarm (a long id in a string, a hex string such as "3e100") only costs
# the exact parser's time.
_SHAPE = bytes(
    0x30
    if 0x30 <= byte <= 0x39 or byte == 0x2E
    else 0x65
    if byte in (0x45, 0x65)
    else 0x2D
    if byte in (0x2B, 0x2D)
    else 0x20
    for byte in range(256)
)
# 16 digits-or-dots: an integer beyond 64 bits (20 digits, or 19 and a sign) or a number with
# more than 15 significant digits. A three-digit exponent: beyond a double's range, or near it.
_INEXACT = (b"0" * 16, b"0e000", b"0e-000")

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
# An integral value of more digits is compared by its canonical text (``1e5000``) instead of
# being expanded into an integer: a short body must not cost a huge one's work.
_MAX_INT_DIGITS = 1000
_BIG = 10**_MAX_INT_DIGITS
# The fast path's normalized form, for a look at its floats: "0" stays and the other digits
# become "1"; ".", "e" and "+" stay; the bytes that end a number (",", "]", "}") become ",";
# every other byte a space. A float with an integral value is written "1200.0" or, from 1e16 up,
# "1e+16": ".0," (or a final ".0") or "e+1". Inside a string the same bytes only cost a walk.
_FLOATS = bytes(
    0x31
    if 0x31 <= byte <= 0x39
    else byte
    if byte in (0x30, 0x2E, 0x65, 0x2B)
    else 0x2C
    if byte in (0x2C, 0x5D, 0x7D)
    else 0x20
    for byte in range(256)
)

# Prefix the exact forms of payloads no fast-path form can equal (those never hold such
# numbers): integers beyond 64 bits (kept from earlier releases, so that receipts stored by
# them still match), and numbers a double cannot hold.
_BIG_INT_DOMAIN = b"receiver:exact-json:"
_DECIMAL_DOMAIN = b"receiver:exact-decimal:"
_FORM_DOMAIN = b"receiver:form:"
# A body hashed as it is (neither JSON nor a form) that begins like those prefixes could spell
# another body's normalized form: it is kept apart by a prefix of its own.
_RAW_DOMAIN = b"receiver:raw:"
# A sender's per-attempt field inside the signed body (Linear): not part of the event.
ATTEMPT_FIELD = "webhookTimestamp"
_MAX_FORM_FIELDS = 1000

#: The deepest nesting a payload may have (orjson's serializer refuses deeper ones).
MAX_DEPTH = 254


@dataclass(frozen=True, slots=True)
class Parsed:
    payload: Any
    event_type: str
    payload_hash: bytes
    problem: str | None = None


class NotJSON(ValueError):
    """The body is not JSON, or is nested too deep to normalize."""


def attempt_field_of(verifier: object) -> str | None:
    """The per-attempt field a scheme's sender refreshes inside the signed body (Linear's
    ``webhookTimestamp``), left out of its fingerprints; None for every other scheme."""
    field = getattr(verifier, "attempt_field", None)
    return field if isinstance(field, str) and field else None


def parse(body: bytes, event_type: str | None, attempt_field: str | None = None) -> Parsed:
    """Parse the verified body once. The hash is of the normalized payload (sorted keys, no
    insignificant whitespace, numbers by the rule above, without a top-level integer
    ``attempt_field``), so a re-serialized redelivery still matches its receipt."""
    try:
        payload, normalized_form = normalized(body, attempt_field=attempt_field)
    except NotJSON as exc:
        form = _form(body) if event_type is not None else None
        if form is None:
            return Parsed(None, "", hashlib.sha256(raw_form(body)).digest(), str(exc))
        payload, normalized_form = form
    if event_type is None:
        event_type = payload.get("type") if isinstance(payload, dict) else None
        if not isinstance(event_type, str) or not _EVENT_TYPE.fullmatch(event_type):
            return Parsed(
                payload,
                "",
                hashlib.sha256(raw_form(body)).digest(),
                'the body must be a JSON object with a "type": a string of 1-255 characters '
                "without control characters",
            )
    return Parsed(payload, event_type, hashlib.sha256(normalized_form).digest())


def raw_form(body: bytes) -> bytes:
    """What a body fingerprinted as it is (not JSON) is hashed as: itself, unless it begins
    with ``receiver:``, the normalized forms' prefix (then behind a prefix of its own)."""
    return _RAW_DOMAIN + body if body.startswith(b"receiver:") else body


def _form(body: bytes) -> tuple[dict[str, Any], bytes] | None:
    """A form body's payload and normalized form, or None if it is not a form."""
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=True,
            max_num_fields=_MAX_FORM_FIELDS,
        )
    except ValueError:  # also UnicodeDecodeError
        return None
    if not pairs:
        return None
    payload: dict[str, Any] = {}
    for name, value in pairs:
        if name in payload:
            earlier = payload[name]
            payload[name] = [*earlier, value] if isinstance(earlier, list) else [earlier, value]
        else:
            payload[name] = value
    return payload, _FORM_DOMAIN + orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def _without(payload: Any, field: str | None) -> Any:
    """The payload without a top-level integer ``field`` (the fingerprint's view of it)."""
    if field is None or not isinstance(payload, dict):
        return payload
    value = payload.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        return payload
    return {k: v for k, v in payload.items() if k != field}


def normalized(body: bytes, *, attempt_field: str | None = None) -> tuple[Any, bytes]:
    """The payload (numbers as ints and floats, for handlers) and its normalized form (for
    the fingerprint, without a top-level integer ``attempt_field``); NotJSON if the body is
    not JSON or is nested too deep."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise NotJSON("the body is not valid JSON") from None
    shape = body.translate(_SHAPE)
    try:
        if any(mark in shape for mark in _INEXACT):
            # orjson accepted it, so it is strict JSON: read it again with exact numbers.
            exact = json.loads(body, parse_float=decimal.Decimal)
            return json.loads(body), _exact(_without(exact, attempt_field))
        kept = _without(payload, attempt_field)
        form = orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)
        look = form.translate(_FLOATS)
        if b".0," in look or look.endswith(b".0") or b"e+1" in look:
            try:
                form = orjson.dumps(_integral_floats(kept), option=orjson.OPT_SORT_KEYS)
            except _BeyondInt:  # an integral value past 64 bits: the exact path says it
                exact = json.loads(body, parse_float=decimal.Decimal)
                return payload, _exact(_without(exact, attempt_field))
        return payload, form
    except (orjson.JSONEncodeError, RecursionError):
        raise NotJSON(f"the payload is nested deeper than {MAX_DEPTH} levels") from None


class _BeyondInt(Exception):
    """A float of the fast path holds an integral value beyond a 64-bit integer."""


def _integral_floats(value: Any) -> Any:
    """The fast path's payload with each float of integral value as that integer (a float here
    came from a decimal of at most 15 significant digits, which its shortest text gives back)."""
    if isinstance(value, float):
        if not value.is_integer():
            return value
        number = int(value) if abs(value) <= 2**53 else int(decimal.Decimal(repr(value)))
        if not _INT_MIN <= number <= _INT_MAX:
            raise _BeyondInt
        return number
    if isinstance(value, dict):
        return {k: _integral_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats(v) for v in value]
    return value


def _exact(payload: Any) -> bytes:
    """The normalized form of a payload read with exact numbers: as the fast path writes it
    where every number fits a double or a 64-bit integer exactly, else in a domain of its own."""
    inexact: list[bool] = []
    converted = _doubles(payload, 0, inexact)
    if inexact:
        return _DECIMAL_DOMAIN + orjson.dumps(_fragments(converted), option=orjson.OPT_SORT_KEYS)
    if _has_big_int(converted):
        text = json.dumps(converted, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return _BIG_INT_DOMAIN + text.encode()
    return orjson.dumps(converted, option=orjson.OPT_SORT_KEYS)


def _doubles(value: Any, depth: int, inexact: list[bool]) -> Any:
    """Integral values become integers, other decimals a double holds exactly floats (as the
    fast path reads them); the rest become their canonical text, marked. Appends to
    ``inexact`` when it meets one."""
    if isinstance(value, decimal.Decimal):
        integral = _integral(value)
        if integral is not None:
            return integral
        if _fits_double(value):
            return float(value)
        inexact.append(True)
        return _Exact(_canonical(value))
    if isinstance(value, int) and not isinstance(value, bool) and not -_BIG < value < _BIG:
        inexact.append(True)
        return _Exact(_canonical(decimal.Decimal(value)))
    if isinstance(value, dict | list) and depth >= MAX_DEPTH:
        raise RecursionError("nested too deep")  # as deep as orjson refuses
    if isinstance(value, dict):
        return {k: _doubles(v, depth + 1, inexact) for k, v in value.items()}
    if isinstance(value, list):
        return [_doubles(v, depth + 1, inexact) for v in value]
    return value


class _Exact(str):
    """A number's canonical decimal text, told apart from a string when written."""


def _fragments(value: Any) -> Any:
    """Marked decimals and integers beyond 64 bits as raw text (NUL-prefixed, which orjson
    never writes itself, so no string can equal them)."""
    if isinstance(value, _Exact):
        return orjson.Fragment(b"\x00" + value.encode())
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
        return orjson.Fragment(str(value).encode())
    if isinstance(value, dict):
        return {k: _fragments(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fragments(v) for v in value]
    return value


def _integral(value: decimal.Decimal) -> int | None:
    """The integer a finite decimal of integral value equals (of at most 1000 digits), else
    None. Read from its digits: no context precision can round it."""
    if not value.is_finite():
        return None
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if exponent < 0:
        if any(digits[exponent:]):
            return None
        digits, exponent = digits[:exponent], 0
    if len(digits) + exponent > _MAX_INT_DIGITS:
        return None
    number = int("".join(map(str, digits)) or "0") * int(10**exponent)
    return -number if sign else number


def _fits_double(value: decimal.Decimal) -> bool:
    """At most 15 significant digits and well inside a double's normal range: a double holds
    it, and tells it apart from every other such number."""
    if not value.is_finite():
        return False
    significant = len(bytes(value.as_tuple().digits).rstrip(b"\x00"))  # no trailing zeros
    return significant <= 15 and (value.is_zero() or -300 <= value.adjusted() <= 300)


def _canonical(value: decimal.Decimal) -> str:
    """The exact value as ``[-]DIGITSeEXP`` with no trailing zero in DIGITS: one text per value
    (``1.50`` and ``15e-1`` are both ``15e-1``), whatever the context's precision."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).rstrip("0")
    if not text:
        return ("-" if sign else "") + "0"
    exponent += len(digits) - len(text)
    return ("-" if sign else "") + f"{text}e{exponent}"


def _has_big_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not _INT_MIN <= value <= _INT_MAX
    if isinstance(value, dict):
        return any(_has_big_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_big_int(v) for v in value)
    return False
