"""Verification of Standard Webhooks deliveries, on the raw body bytes.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``. A ``webhook-signature`` header
is a space-delimited list of ``v1,<base64 HMAC-SHA256>`` and ``v1a,<base64 ed25519>`` entries; one
valid entry against one configured secret is enough, which is how senders rotate secrets.

Svix, the reference sender, names the headers ``svix-id``, ``svix-timestamp`` and
``svix-signature`` unless an account brands them: each field is read from either name, as Svix's
libraries read it, and a field sent under both names with two different values is refused.

Verification is total: for any headers and body, :meth:`StandardWebhooks.verify` returns a
:class:`VerifiedDelivery` or raises :class:`~receiver._exceptions.VerificationError` (401) or its
subclass :class:`~receiver._exceptions.MalformedRequest` (400). The ``check`` attribute of the
error names what failed:

    missing_header:<name>     MalformedRequest   webhook-id, -timestamp or -signature absent/empty
                                                 (svix-... when the delivery uses Svix's names)
    duplicate_header:<name>   MalformedRequest   the header was sent more than once, or under
                                                 both names (svix-id, webhook-id) with two values
    webhook_id                MalformedRequest   not 1-255 visible ASCII characters without "."
    timestamp                 MalformedRequest   not a plain decimal integer of at most 12 digits
    timestamp                 VerificationError  outside the tolerance ("too old" / "too new")
    signature                 MalformedRequest   header too long, no entries, or too many entries
    signature                 VerificationError  no entry verifies against any secret

Structural checks (400) come before the clock (401) and the crypto, so the status of a malformed
delivery does not depend on when it arrives. Messages never contain secrets or signatures.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets as _secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from receiver._exceptions import ConfigurationError, MalformedRequest, VerificationError
from receiver._verification.spelling import canonical_b64

if TYPE_CHECKING:
    from starlette.datastructures import Headers

__all__ = [
    "MAX_SIGNATURE_ENTRIES",
    "MAX_SIGNATURE_HEADER",
    "StandardWebhooks",
    "VerifiedDelivery",
    "Verifier",
    "generate_keypair",
    "generate_secret",
    "sign",
]

#: Longest ``webhook-signature`` value accepted, in bytes. Real senders send one or two
#: entries (~50 or ~90 characters each); the bound keeps hostile headers cheap to refuse.
MAX_SIGNATURE_HEADER = 8192
#: Most signature entries examined; with N secrets that bounds a delivery to 32 * N checks.
MAX_SIGNATURE_ENTRIES = 32

# Visible ASCII (RFC 5234 VCHAR, 0x21-0x7E) without "." (0x2E): the id ends at the first "." of
# the signed content, so a "." in it would let one signature pass for a different id/body split.
_WEBHOOK_ID = re.compile(rb"[\x21-\x2d\x2f-\x7e]{1,255}")
# Canonical decimal only: no sign, spaces, exponent, fraction or leading zero. The header text is
# signed as sent, so accepting "01614265330" would sign differently from the integer it denotes.
_TIMESTAMP = re.compile(rb"0|[1-9][0-9]{0,11}")
# Base64 lengths of a 32-byte HMAC-SHA256 digest and of a 64-byte ed25519 signature, padded.
_V1_B64_LEN = 44
_V1A_B64_LEN = 88

_HEADER_KEYS = (
    b"webhook-id",
    b"webhook-timestamp",
    b"webhook-signature",
    b"svix-id",
    b"svix-timestamp",
    b"svix-signature",
)


@dataclass(frozen=True, slots=True)
class VerifiedDelivery:
    """What a verifier vouches for: the sender's id and timestamp of one delivery."""

    webhook_id: str
    #: Unix seconds from the signed ``webhook-timestamp`` header.
    timestamp: int | None
    #: Only for schemes that carry the event type in a signed header; None for Standard Webhooks.
    event_type: str | None = None
    #: A delivery id the sender sends beside a key made from what it signs (Linear's
    #: Linear-Delivery): never the key (a replayer could choose it), only a hint for drift alerts.
    hint: str | None = None


class Verifier(Protocol):
    """Checks one delivery before anything touches the store."""

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        """Return the verified delivery, or raise VerificationError (or MalformedRequest)."""
        ...


def _b64decode_key(encoded: str, what: str) -> bytes:
    # Secrets are often stored without padding (svix-style whsec_ of 24 bytes has none anyway).
    encoded = encoded + "=" * (-len(encoded) % 4)
    try:
        return binascii.a2b_base64(encoded, strict_mode=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        raise ConfigurationError(
            f"{what} is not valid base64 after its prefix; copy the whole value from the "
            "sender's dashboard, or pass raw bytes for an HMAC key"
        ) from None


def _load_secret(secret: str | bytes, what: str) -> bytes | Ed25519PublicKey | Ed25519PrivateKey:
    """Decode one configured secret: HMAC key bytes, an ed25519 public or private key."""
    if isinstance(secret, bytes):
        if not secret:
            raise ConfigurationError(f"{what} is empty; give a non-empty HMAC key")
        return secret
    if not isinstance(secret, str):
        raise ConfigurationError(f"{what} must be str (whsec_/whpk_/whsk_...) or bytes")
    # Values pasted into environment variables often carry a trailing newline.
    secret = secret.strip()
    prefix, sep, encoded = secret.partition("_")
    if not sep or prefix not in ("whsec", "whpk", "whsk"):
        raise ConfigurationError(
            f"{what} has no whsec_, whpk_ or whsk_ prefix: give the secret as the sender shows "
            "it (whsec_ followed by base64); a raw HMAC key without a prefix can be given in "
            "code, as bytes"
        )
    raw = _b64decode_key(encoded, what)
    if prefix == "whsec":
        if not raw:
            raise ConfigurationError(f"{what} is an empty whsec_ secret; generate a new one")
        return raw
    if prefix == "whpk":
        if len(raw) != 32:
            raise ConfigurationError(
                f"{what}: a whpk_ key must encode a 32-byte ed25519 public key, "
                f"got {len(raw)} bytes"
            )
        try:
            return Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            raise ConfigurationError(f"{what} is not a valid ed25519 public key") from None
    # whsk_: a 32-byte seed, or seed + public key (64 bytes) as libsodium and others emit.
    if len(raw) not in (32, 64):
        raise ConfigurationError(
            f"{what}: a whsk_ key must encode a 32-byte ed25519 seed (or 64 bytes seed + public "
            f"key), got {len(raw)} bytes"
        )
    private = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if len(raw) == 64 and private.public_key().public_bytes_raw() != raw[32:]:
        raise ConfigurationError(
            f"{what}: the public half of this 64-byte whsk_ key does not match its seed"
        )
    return private


class StandardWebhooks:
    """Verifies Standard Webhooks signatures (v1 HMAC-SHA256 and v1a ed25519).

    ``secrets`` lists every key currently valid for this sender, so a rotation can overlap:
    ``"whsec_<base64>"`` or raw ``bytes`` for HMAC, ``"whpk_<base64>"`` for an ed25519 public key,
    or ``"whsk_<base64>"`` for an ed25519 private key (its public half is used). ``tolerance`` is
    the accepted clock difference in seconds, in both directions.
    """

    __slots__ = ("_ed25519", "_hmacs", "tolerance")

    #: Svix, the reference sender, stops retrying a message when the response carries this
    #: header ("Delivery Control", https://docs.svix.com/receiving/delivery-control); other
    #: Standard Webhooks senders ignore a header they do not know.
    stop_retry: tuple[tuple[str, str], ...] = (("webhook-delivery", "abort-message"),)

    def __init__(self, secrets: Sequence[str | bytes], *, tolerance: float = 300.0) -> None:
        if isinstance(secrets, str | bytes):
            # A lone string is a Sequence too; iterating it would give one "secret" per character.
            raise ConfigurationError("secrets must be a list of secrets, e.g. [secret]")
        if not secrets:
            raise ConfigurationError("no secrets configured; give at least one whsec_/whpk_ key")
        if (
            isinstance(tolerance, bool)  # an int: True as "1 second" is always a mistake
            or not isinstance(tolerance, int | float)
            or not 0 <= tolerance < float("inf")  # also refuses NaN
        ):
            raise ConfigurationError("tolerance must be a finite number of seconds >= 0")
        hmacs: list[hmac.HMAC] = []
        ed25519: list[Ed25519PublicKey] = []
        for index, secret in enumerate(secrets):
            key = _load_secret(secret, f"secrets[{index}]")
            if isinstance(key, bytes):
                # Keyed once: verify copies it, which is about twice as fast as hmac.digest()
                # re-keying on every request (OpenSSL 3 looks the digest up on each call).
                hmacs.append(hmac.new(key, digestmod=hashlib.sha256))
            elif isinstance(key, Ed25519PrivateKey):
                ed25519.append(key.public_key())
            else:
                ed25519.append(key)
        self._hmacs = tuple(hmacs)
        self._ed25519 = tuple(ed25519)
        self.tolerance = float(tolerance)

    def __repr__(self) -> str:
        # Counts only: the keys themselves must never reach a log line or a traceback.
        return (
            f"StandardWebhooks(v1_keys={len(self._hmacs)}, v1a_keys={len(self._ed25519)}, "
            f"tolerance={self.tolerance})"
        )

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key of a delivery the caller vouches for (``Receiver.enqueue_many``):
        the webhook-id, which this scheme signs."""
        return sender_id

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        """Verify one delivery against ``now`` (unix seconds); see the module docstring."""
        # Everything below works on the raw header bytes: this is the hot path, and decoding,
        # Headers.getlist() (one scan per call) and str round trips cost more than the HMAC.
        raw = headers.raw
        found = dict(raw)  # built in C; like getlist(), matches the lowercase names ASGI gives
        if len(found) != len(raw):
            _refuse_duplicates(raw)  # some name repeats: fine unless it is one of ours
        msg_id = found.get(b"webhook-id")
        timestamp = found.get(b"webhook-timestamp")
        signature = found.get(b"webhook-signature")
        named = "webhook"
        if b"svix-id" in found or b"svix-timestamp" in found or b"svix-signature" in found:
            msg_id, timestamp, signature = _svix_names(found, msg_id, timestamp, signature)
            named = "svix"  # a missing header is named as the sender names the others
        # An empty value carries nothing to check: treated as absent.
        if not msg_id:
            raise _missing(named, "id")
        if not timestamp:
            raise _missing(named, "timestamp")
        if not signature:
            raise _missing(named, "signature")
        if _WEBHOOK_ID.fullmatch(msg_id) is None:
            raise MalformedRequest("webhook_id", "webhook-id must be 1-255 visible ASCII, no '.'")
        if _TIMESTAMP.fullmatch(timestamp) is None:
            raise MalformedRequest("timestamp", "webhook-timestamp must be integer unix seconds")
        if len(signature) > MAX_SIGNATURE_HEADER:
            raise MalformedRequest("signature", "webhook-signature header too long")
        # The spec delimits entries with single spaces, and the reference libraries split on
        # " " alone: a tab or a comma between entries fails there, so it fails here too. Empty
        # entries (repeated spaces) match nothing there and are dropped here.
        entries = [entry for entry in signature.split(b" ") if entry]
        if not entries:
            raise MalformedRequest("signature", "webhook-signature lists no signatures")
        if len(entries) > MAX_SIGNATURE_ENTRIES:
            raise MalformedRequest("signature", "webhook-signature lists too many signatures")

        ts = int(timestamp)
        if now - ts > self.tolerance:
            raise VerificationError("timestamp", "webhook-timestamp too old")
        if ts - now > self.tolerance:
            raise VerificationError("timestamp", "webhook-timestamp too new")

        prefix = msg_id + b"." + timestamp + b"."  # signed as sent; the regexes made it canonical
        content: bytes | None = None  # prefix + body, built only if a v1a entry needs it
        expected: list[bytes] | None = None
        for entry in entries:
            version, _, encoded = entry.partition(b",")
            if version == b"v1" and self._hmacs and len(encoded) == _V1_B64_LEN:
                given = canonical_b64(encoded)
                if given is None:
                    continue
                if expected is None:  # computed once, on the first v1 entry worth checking
                    expected = []
                    for keyed in self._hmacs:
                        # Two updates instead of prefix + body: no copy of a large body.
                        mac = keyed.copy()
                        mac.update(prefix)
                        mac.update(body)
                        expected.append(mac.digest())
                for digest in expected:
                    if hmac.compare_digest(digest, given):
                        return VerifiedDelivery(msg_id.decode("ascii"), ts)
            elif version == b"v1a" and self._ed25519 and len(encoded) == _V1A_B64_LEN:
                given = canonical_b64(encoded)
                if given is None or len(given) != 64:
                    continue
                if content is None:
                    content = prefix + body
                for public_key in self._ed25519:
                    try:
                        public_key.verify(given, content)
                    except InvalidSignature:
                        continue
                    return VerifiedDelivery(msg_id.decode("ascii"), ts)
            # Anything else (unknown version, wrong length, no comma) is ignored, as the spec
            # asks: a sender may add schemes we do not know next to ones we do.
        raise VerificationError("signature", "no valid signature for the configured secrets")


def _missing(named: str, field: str) -> MalformedRequest:
    name = f"{named}-{field}"
    return MalformedRequest(f"missing_header:{name}", f"{name} header is required")


def _svix_names(
    found: dict[bytes, bytes],
    msg_id: bytes | None,
    timestamp: bytes | None,
    signature: bytes | None,
) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The three values when Svix's own names are sent: ``svix-*`` is what Svix sends by
    default (``webhook-*`` only when an account brands its headers), and its libraries read
    each field from either name. Where both names of one field arrive with different values,
    Svix's libraries take the ``svix-`` one silently; here it is refused (400
    ``duplicate_header:webhook-<field>``), as a header sent twice is: anything else in front of
    the receiver that reads the other name would see another id, time or signature."""
    values = []
    for ours, svix, name in (
        (msg_id, found.get(b"svix-id"), "id"),
        (timestamp, found.get(b"svix-timestamp"), "timestamp"),
        (signature, found.get(b"svix-signature"), "signature"),
    ):
        if ours is not None and svix is not None and ours != svix:
            raise MalformedRequest(
                f"duplicate_header:webhook-{name}",
                f"svix-{name} and webhook-{name} were both sent, with different values",
            )
        values.append(svix if svix is not None else ours)
    return values[0], values[1], values[2]


def _refuse_duplicates(raw: list[tuple[bytes, bytes]]) -> None:
    # Two values would leave it to us which one is "the" id or signature, and a proxy in front
    # of us could pick the other one. Refuse rather than guess.
    for key in _HEADER_KEYS:
        if sum(1 for name, _ in raw if name == key) > 1:
            name = key.decode("ascii")
            raise MalformedRequest(f"duplicate_header:{name}", f"{name} header sent more than once")


def sign(secret: str | bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """Return a ``webhook-signature`` entry for this delivery.

    ``"v1,..."`` for a whsec_ or bytes secret, ``"v1a,..."`` for a whsk_ private key. The id and
    timestamp are signed as given, without validation, so tests can sign deliveries that
    `StandardWebhooks.verify` must refuse for other reasons.
    """
    key = _load_secret(secret, "secret")
    content = f"{webhook_id}.{timestamp}.".encode() + body
    if isinstance(key, bytes):
        digest = hmac.digest(key, content, "sha256")
        return "v1," + base64.b64encode(digest).decode("ascii")
    if isinstance(key, Ed25519PrivateKey):
        return "v1a," + base64.b64encode(key.sign(content)).decode("ascii")
    raise ConfigurationError("a whpk_ public key can only verify; sign with its whsk_ private key")


def generate_secret() -> str:
    """Return a new random HMAC secret, ``"whsec_"`` + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(_secrets.token_bytes(24)).decode("ascii")


def generate_keypair() -> tuple[str, str]:
    """Return a new ed25519 key pair as ``("whsk_<seed>", "whpk_<public key>")``."""
    private = Ed25519PrivateKey.generate()
    return (
        "whsk_" + base64.b64encode(private.private_bytes_raw()).decode("ascii"),
        "whpk_" + base64.b64encode(private.public_key().public_bytes_raw()).decode("ascii"),
    )
