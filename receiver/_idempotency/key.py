"""Parsing the ``Idempotency-Key`` request header (draft-ietf-httpapi-idempotency-key-header).

The draft defines the field as an Item Structured Header whose value is a String (RFC 8941
section 3.3.3): ``Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"``. Many clients send
the bare value instead (``Idempotency-Key: 8e03978e-...``), as Stripe documents it; a bare
token of visible ASCII without quotes, commas, semicolons, backslashes or spaces is accepted
too. Anything else, more than one field, or a key longer than 255 characters is refused: a key
that cannot be read exactly must never be guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .._exceptions import InvalidIdempotencyKey

MAX_LENGTH = 255

# RFC 8941 sf-string: printable ASCII; '"' and '\' only escaped.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_ESCAPE = re.compile(r"\\([\"\\])")
# A bare key: RFC 9110 tchar plus ':', '/' and '=' (base64 and URN-like keys).
_BARE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z:/=]+")


def parse_key(values: Sequence[bytes]) -> str | None:
    """The key of a request, from every value of its Idempotency-Key fields; None if absent."""
    if not values:
        return None
    if len(values) > 1:
        raise InvalidIdempotencyKey("the Idempotency-Key header appears more than once; send one")
    raw = values[0]
    if any(b > 0x7E or (b < 0x20 and b != 0x09) for b in raw):
        raise InvalidIdempotencyKey("the Idempotency-Key header must be printable ASCII")
    text = raw.decode("ascii").strip(" \t")
    if not text:
        raise InvalidIdempotencyKey("the Idempotency-Key header is empty")
    quoted = _SF_STRING.fullmatch(text)
    if quoted is not None:
        key = _ESCAPE.sub(r"\1", quoted.group(1))
    elif _BARE.fullmatch(text):
        key = text
    else:
        raise InvalidIdempotencyKey(
            'the Idempotency-Key header must be one quoted string ("key") or one bare token '
            "of letters, digits and !#$%&'*+-.^_`|~:/="
        )
    if not key:
        raise InvalidIdempotencyKey("the Idempotency-Key is empty")
    if len(key) > MAX_LENGTH:
        raise InvalidIdempotencyKey(f"the Idempotency-Key is longer than {MAX_LENGTH} characters")
    return key
