"""How a signature must be spelled: as its sender spells it, and as the sender's own library
compares it.

The senders' libraries compare the signature as text with the one they compute (Stripe's,
Slack's, Paddle's, Twilio's, Svix's; GitHub's, Shopify's and Linear's Node libraries), so of the
spellings that decode to the right MAC only the one the sender sends verifies there: lower-case
hex, canonical base64 with its padding. The receiver refuses the others too, with the 401 a
wrong signature gets: such a request comes from no sender, and one signature that could be
written several ways would let a replayer vary the header the signature covers.
"""

from __future__ import annotations

import binascii
import re

__all__ = ["NEVER", "canonical_b64", "hex_digest"]

#: What a well-formed but wrongly spelled signature decodes to here: no HMAC is empty, so it
#: matches nothing, and the delivery gets the 401 of a wrong signature.
NEVER = b""

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def hex_digest(value: str, prefix: str) -> bytes | None:
    """The 32-byte digest of ``prefix`` + 64 lower-case hex digits; :data:`NEVER` for 64 hex
    digits with an upper-case one (no sender writes them, no sender's library accepts them);
    None for anything else."""
    if not value.startswith(prefix):
        return None
    digits = value[len(prefix) :]
    # The regex first: bytes.fromhex would also accept spaces between the digits.
    if _HEX64.fullmatch(digits) is None:
        return None
    return bytes.fromhex(digits) if digits == digits.lower() else NEVER


def canonical_b64(encoded: bytes) -> bytes | None:
    """The bytes ``encoded`` spells in strict, canonical base64, or None. The bits a last
    character carries beyond the data must be zero: ``...Q=`` and ``...R=`` decode alike, and
    only the first is what the sender wrote."""
    try:
        decoded = binascii.a2b_base64(encoded, strict_mode=True)
    except binascii.Error:
        return None
    return decoded if binascii.b2a_base64(decoded, newline=False) == encoded else None
