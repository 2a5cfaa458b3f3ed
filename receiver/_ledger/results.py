"""What tools and handlers return, as the JSON bytes stored and replayed.

A tool's or a handler's result is stored once and replayed byte for byte, so it must become
JSON. orjson already writes dataclasses, datetimes, dates, UUIDs and enums; the types users
return beyond those are covered here:

- ``decimal.Decimal`` is written as the exact JSON number it holds (``Decimal("12.30")`` is
  ``12.30``), never rounded through a float; NaN and the infinities are no JSON number;
- Pydantic models (every OpenAI and Anthropic SDK response is one) and anything else with a
  ``model_dump(mode="json")``, duck-typed so that the core does not import Pydantic;
- anything an ``encoder`` hook turns into one of the above.

And what a ``reconcile`` function returns when the effect did not happen: :data:`RUN_AGAIN`.

What is still not JSON raises :class:`NotStorable`, naming the type and never the value. The
caller decides what that means: for an external effect that already happened, it must never
mean "run it again".
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from typing import Any

import orjson

from .._exceptions import ReceiverError

#: Turns a value orjson cannot write into one it can; raises TypeError for what it does not know.
Encoder = Callable[[Any], Any]


class NotStorable(ReceiverError, TypeError):
    """A result cannot be stored (as JSON, or as an HTTP answer to replay); ``type_name`` names
    its type (never its value), ``why`` what to return instead."""

    def __init__(self, type_name: str, why: str | None = None) -> None:
        self.type_name = type_name
        super().__init__(
            why
            or f"a value of type {type_name} is not JSON: return a JSON-able value, or pass "
            "encoder= to turn it into one"
        )


def dumps(value: Any, encoder: Encoder | None = None) -> bytes:
    """``value`` as JSON bytes; :class:`NotStorable` if some part of it cannot be."""

    def default(obj: Any) -> Any:
        if isinstance(obj, decimal.Decimal):
            if not obj.is_finite():
                raise NotStorable("Decimal (NaN or infinite)")
            # str() of a finite Decimal is always a valid JSON number ("12.30", "1E+2", "-0"):
            # written as it is, exactly.
            return orjson.Fragment(str(obj))
        dump = getattr(obj, "model_dump", None)
        if callable(dump):
            return dump(mode="json")
        if encoder is not None:
            try:
                return encoder(obj)
            except TypeError:
                pass
        raise NotStorable(_type_name(obj))

    try:
        try:
            out = orjson.dumps(value, default=default)
        except orjson.JSONEncodeError as exc:
            if "64-bit" not in str(exc):
                raise
            # An integer past 64 bits (a payload's id, say) is JSON all the same: written
            # exactly, as its decimal digits.
            out = orjson.dumps(_exact_ints(value), default=default)
    except NotStorable:
        raise
    except orjson.JSONEncodeError as exc:
        # orjson wraps the error raised in default(); find ours, else name what it refused.
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, NotStorable):
            raise cause from None
        raise NotStorable(_refused(value, str(exc))) from None
    # orjson writes a NaN or an infinity as null: stored so, it would replay as None.
    if b"null" in out and _non_finite(value):
        raise NotStorable("float (NaN or infinite)")
    return out


#: The integers orjson writes as numbers (signed and unsigned 64 bits); the verification layer
#: keeps the same bounds for the same reason (the layers do not import each other).
_ORJSON_INT_MIN, _ORJSON_INT_MAX = -(2**63), 2**64 - 1


def _exact_ints(value: Any) -> Any:
    """``value`` with every integer orjson cannot write as a fragment of its digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _ORJSON_INT_MIN <= value <= _ORJSON_INT_MAX else orjson.Fragment(str(value))
    if isinstance(value, dict):
        return {k: _exact_ints(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_exact_ints(v) for v in value]
    return value


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False


def _type_name(obj: Any) -> str:
    cls = type(obj)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _refused(value: Any, message: str) -> str:
    """orjson's own refusals (an integer beyond 64 bits, a dict key that is not a string, too
    deep a nesting) carry no value in their text; keep its words as the description."""
    return f"{_type_name(value)} ({message})"


class RunAgain:
    """Returned by a ``reconcile`` function: the external effect did not happen, run the
    handlers (or the tool) again."""

    def __repr__(self) -> str:
        return "RUN_AGAIN"


RUN_AGAIN = RunAgain()
