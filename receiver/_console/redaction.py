"""What the console shows of a payload, a stored answer or an error: redacted like the logs.

The logs never carry a payload value, and a driver's error is stored with its quoted parts
masked (receiver/_ops/redact.py). A console that shows payloads (only where the operator
enabled it) keeps to the same spirit: the JSON's shape and its ordinary values are shown, but
the value of any field whose name says it is a secret (password, token, secret, key,
authorization, card number, ...) is masked, and so is any string that looks like a credential
or a card number wherever it appears, errors included. A body that is not JSON is not shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson

MASK = "•••"

#: Field names whose values are never shown (matched case-insensitively, anywhere in the name).
SECRET_FIELDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "api_key",
    "apikey",
    "access_key",
    "private_key",
    "signature",
    "cookie",
    "session",
    "card",
    "cvc",
    "cvv",
    "pan",
    "iban",
    "ssn",
    "pin",
    "otp",
)

# Credentials by their look: Standard Webhooks and Stripe-like secrets, bearer tokens, JWTs,
# and 13-19 digit runs (card numbers, with spaces or dashes between groups).
_LOOKS_SECRET = re.compile(
    r"(?:whsec_|whsk_|whpk_|sk_live_|sk_test_|rk_live_|rk_test_|xox[abpr]-|ghp_|gho_|github_pat_)"
    r"[A-Za-z0-9_\-+/=]+"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=\-]+"
    r"|eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+"
    r"|\b(?:\d[ -]?){12,18}\d\b"
)


def mask_text(text: str) -> str:
    """``text`` with anything that looks like a credential or a card number masked."""
    return _LOOKS_SECRET.sub(MASK, text)


def secret_field(name: str, extra: Iterable[str] = ()) -> bool:
    lowered = name.lower()
    words = re.split(r"[^a-z0-9]+|(?<=[a-z])(?=[0-9])", lowered)
    for marker in (*SECRET_FIELDS, *extra):
        if len(marker) <= 3:  # short markers (pan, pin, ssn, otp) as whole words only
            if marker in words:
                return True
        elif marker in lowered:
            return True
    return False


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
