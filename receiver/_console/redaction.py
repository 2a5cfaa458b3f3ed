"""What the console shows of a payload, a stored answer or an error: redacted like the logs.

The logs never carry a payload value, and a driver's error is stored with its quoted parts
masked (receiver/_ops/redact.py). A console that shows payloads (only where the operator
enabled it) keeps to the same spirit and the same rule (receiver/_secrets.py): the JSON's shape
and its ordinary values are shown, but the value of any field whose name says it is a secret
(password, token, secret, key, authorization, card number, ...) is masked, and so is, in any
string and in every error, a ``name=value`` pair with such a name, a URL's password and
anything that looks like a credential or a card number. A body that is not JSON is not shown.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from .._secrets import MASK, mask_text, secret_field


def error_line(text: str | None, width: int | None = 120) -> str:
    """An error as every page shows it: masked, then its first line cut to ``width`` (masked
    first, so that a cut never leaves part of a card number or a token in clear)."""
    if not text:
        return ""
    masked = mask_text(text)
    if width is None:
        return masked
    return (masked.splitlines() or [""])[0][:width]


def redact(value: Any, extra: Iterable[str] = ()) -> Any:
    """A copy of a JSON value with secret fields and secret-looking strings masked."""
    fields = tuple(extra)
    if isinstance(value, dict):
        return {
            k: MASK if secret_field(str(k), fields) and v is not None else redact(v, fields)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v, fields) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def show_body(body: bytes | None, extra: Iterable[str] = ()) -> str | None:
    """Pretty, redacted JSON; a short note for a body that is not JSON; None for no body."""
    if body is None:
        return None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"({len(body)} bytes, not JSON: not shown)"
    return orjson.dumps(redact(value, extra), option=orjson.OPT_INDENT_2).decode()
