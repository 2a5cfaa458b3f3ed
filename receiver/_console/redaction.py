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

#: Words that make a field's value secret, wherever they stand in its name: ``token``,
#: ``access_token``, ``accessToken`` and ``X-Auth-Token`` alike. Matched as whole words after
#: the name is split (see :func:`words`), so ``key`` masks ``api_key``, ``privateKey`` and
#: ``x-api-key`` but not ``monkey`` or ``keyboard``.
SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "passcode",
        "secret",
        "token",
        "auth",
        "authorization",
        "credential",
        "key",
        "apikey",
        "signature",
        "cookie",
        "session",
        "jwt",
        "card",
        "cvc",
        "cvv",
        "pan",
        "iban",
        "ssn",
        "pin",
        "otp",
    }
)

#: Words that end a compound written without a separator (``accesstoken``, ``clientsecret``,
#: ``newpassword``): long enough that no ordinary word ends with them by chance, unlike
#: ``key`` (monkey) or ``pin`` (spin), which are matched as whole words only.
SECRET_ENDINGS = ("password", "passwd", "secret", "token", "apikey", "signature", "credential")
#: Compounds of ``key`` written as one word.
SECRET_COMPOUNDS = frozenset(
    {"accesskey", "privatekey", "secretkey", "signingkey", "sessionkey", "encryptionkey"}
)

#: A last word that says the field describes a secret without holding it: ``key_id``,
#: ``token_type``, ``keys_url``, ``password_changed_at``, ``card_brand``: such a field is
#: shown.
ABOUT_WORDS = frozenset(
    {
        "id",
        "url",
        "uri",
        "href",
        "type",
        "name",
        "count",
        "length",
        "hint",
        "at",
        "expires",
        "expiry",
        "expiration",
        "brand",
        "present",
        "enabled",
        "required",
    }
)

# Where a field name splits into words: camelCase and acronyms (``customerSSN``,
# ``APIKey``), letters and digits (``cvv2``), and any run of other characters (``_ - . ``).
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

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


def error_line(text: str | None, width: int | None = 120) -> str:
    """An error as every page shows it: masked, then its first line cut to ``width`` (masked
    first, so that a cut never leaves part of a card number or a token in clear)."""
    if not text:
        return ""
    masked = mask_text(text)
    if width is None:
        return masked
    return (masked.splitlines() or [""])[0][:width]


def words(name: str) -> list[str]:
    """A field name's words, lower-cased: ``x-api-key`` and ``xApiKey`` both give
    ``["x", "api", "key"]``, ``customerSSN`` gives ``["customer", "ssn"]``."""
    return [w.lower() for w in _WORD.findall(name)]


def _singular(word: str) -> str:
    # Plurals by their "s" only: keys, tokens, passwords, cards, urls, ids.
    return word[:-1] if len(word) > 2 and word.endswith("s") else word


def _secret_word(word: str) -> bool:
    return any(
        w in SECRET_WORDS or w in SECRET_COMPOUNDS or any(w.endswith(e) for e in SECRET_ENDINGS)
        for w in {word, _singular(word)}
    )


def secret_field(name: str, extra: Iterable[str] = ()) -> bool:
    """True when a field's value must not be shown: a word of its name is a secret word
    (unless its last word says it only describes one: ``token_type``, but not a session's
    id), or the words of one
    of ``extra`` (the operator's own names, matched without that exception) appear in it in
    a row."""
    found = words(name)
    for marker in extra:
        wanted = words(marker)
        if wanted and any(
            found[i : i + len(wanted)] == wanted for i in range(len(found) - len(wanted) + 1)
        ):
            return True
    if not any(_secret_word(w) for w in found):
        return False
    if "session" in found:  # a session's id is the session itself
        return True
    named = [w for w in found if not w.isdigit()]
    about = len(named) > 1 and bool({named[-1], _singular(named[-1])} & ABOUT_WORDS)
    return not about


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
