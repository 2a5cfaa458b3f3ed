"""Verifiers for senders with their own signature schemes: Stripe, GitHub, Shopify and Slack.

(Paddle Billing, Zoom and Linear are in :mod:`.senders`, Twilio in :mod:`.twilio`; they share
the helpers below.)

Each class is a :class:`~receiver._verification.verifier.Verifier`; plug it into a provider with
``Provider("stripe", verifier=Stripe(secrets=[...]), schedule="stripe")``. All four sign with
HMAC-SHA256 under a shared secret, given as ``str`` (its UTF-8 bytes are the key, verbatim) or
``bytes``; list several to rotate. What each signs, and where the ledger's id comes from:

    scheme   signature header                           signed content
    Stripe   Stripe-Signature: t=<unix>,v1=<hex>[,...]  b"{t}." + body
    GitHub   X-Hub-Signature-256: sha256=<hex>          body
    Shopify  X-Shopify-Hmac-Sha256: <base64>            body
    Slack    X-Slack-Signature: v0=<hex>                b"v0:{ts}:" + body

    scheme   id (the ledger key)   event type                      timestamp (unix seconds)
    Stripe   body "id"             None: the body's "type"         t, within tolerance
    GitHub   X-GitHub-Delivery     X-GitHub-Event[.body "action"]  None
    Shopify  X-Shopify-Event-Id    X-Shopify-Topic                 X-Shopify-Triggered-At, unchecked
    Slack    body "event_id"       body event.type, else "type"    X-Slack-Request-Timestamp, idem

The rule for every scheme: the ledger key is the sender's documented event identity, so that a
genuine event is never merged with another and a genuine retry lands on its first key. Where
that identity is signed (Stripe, Slack), a replayer cannot choose it; where it is an unsigned
header (GitHub, Shopify), the same signed content arriving under a new id is reported as key
drift (docs/explanation/keys.md says per scheme why, and what a captured delivery can do).

Stripe (https://docs.stripe.com/webhooks#verify-manually; the SDK's ``stripe.WebhookSignature``):
the key is the whole ``whsec_...`` endpoint secret as text; unlike Standard Webhooks' ``whsec_``
it is NOT base64-decoded. The header carries one ``v1`` per live endpoint secret while a rolled
secret overlaps, so any ``v1`` may match; ``v0`` and unknown elements are ignored. The SDK only
refuses a timestamp that is too old; we refuse one too far in the future as well, as Standard
Webhooks does: a signing clock hours ahead is as suspect as a replay. The id is the Event's
``"id"`` (``evt_...``), the same on every retry (https://docs.stripe.com/webhooks, "Handle
duplicate events"); it is read from the body after the signature verifies.

GitHub (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries and
https://docs.github.com/en/webhooks/webhook-events-and-payloads#delivery-headers): the legacy
SHA-1 ``X-Hub-Signature`` is never accepted. The key is ``X-GitHub-Delivery``, the event's GUID,
which GitHub keeps on a redelivery; it is not signed, and GitHub documents no rule that makes
two events' bodies differ, so the body alone would not do as a key. The event type is
``X-GitHub-Event``, plus ``"." + action`` when the JSON body has a string ``"action"``
(``"issues.opened"``), so ``"issues.*"`` patterns work. Configure the webhook's content type
as ``application/json``: a form-encoded body (``Content-Type: application/x-www-form-urlencoded``)
verifies, then is refused with 400 ``content_type``.

Shopify (https://shopify.dev/docs/apps/build/webhooks/verify-deliveries and .../delivery-structure):
the key is the app's client secret. The ledger key is ``X-Shopify-Event-Id``, Shopify's
documented duplicate test (https://shopify.dev/docs/apps/build/webhooks/ignore-duplicates),
else ``X-Shopify-Webhook-Id`` (kept across Shopify's retries) where a delivery has no event id.
Neither is signed, and the body cannot be the key: one change of a product fires
``products/create`` and ``products/update`` with the same body. The type is the
topic as sent, ``"orders/create"``: handler patterns are prefixes ending in ``".*"``, so register
exact topics or ``"*"``. ``X-Shopify-Triggered-At`` becomes the timestamp when it parses as
ISO-8601 with an offset; it is not signed, so it is never a reason to refuse a delivery.

Slack (https://docs.slack.dev/authentication/verifying-requests-from-slack/ and the Events API,
https://docs.slack.dev/apis/events-api/): the id is the envelope's ``"event_id"``, the same on
Slack's retries. Bodies without one (``url_verification``, ``app_rate_limited``) get the id
``"{type}:{sha256 of the body}"``, so the URL handshake goes through the ledger like any other
delivery: register ``rx.on("url_verification", provider=...)`` returning
``{"challenge": event.payload["challenge"]}``. A non-JSON body (slash commands, interactivity)
verifies, then is refused with 400 ``event_id``: they are not Events API deliveries.

Caveat for GitHub and Shopify: their signatures cover the body only, not the id or type headers.
Someone who captured a delivery can re-send it under a new id: it gets a key of its own, and
the receiver reports the same signed content under another id in the window (the key-drift
alert and metric, the console's receipt page); ``Provider(same_content="hold")`` or
``"absorb"`` keeps it from running. Serve them over TLS only.

Verification is total, as in :mod:`receiver._verification.verifier`: for any headers and body,
``verify``
returns a :class:`VerifiedDelivery` or raises :class:`VerificationError` (401) or its subclass
:class:`MalformedRequest` (400). Structural checks come first (400), then the clock (401), then
the signature (401), and the body (400) only after the signature verifies. ``check`` names:

    missing_header:<name>     MalformedRequest   a required header is absent or empty (Shopify's
                                                 library requires the domain, version and id too)
    duplicate_header:<name>   MalformedRequest   a header we read was sent more than once
    webhook_id                MalformedRequest   the id header is not 1-255 visible ASCII
                                                 (GitHub, Shopify: the event id header)
    event_type                MalformedRequest   the type is not 1-255 visible ASCII
    timestamp                 MalformedRequest   not canonical decimal unix seconds (<= 11 digits)
    timestamp                 VerificationError  outside the tolerance ("too old" / "too new")
    signature                 MalformedRequest   wrong prefix, not hex/base64, wrong length
    signature                 VerificationError  no signature verifies against any secret, or it
                                                 is spelled as the sender's library refuses it
                                                 (upper-case hex, base64 that is not canonical)
    event_id                  MalformedRequest   the verified body has no usable id

Messages never contain secrets, signatures or header values.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from .._exceptions import ConfigurationError, MalformedRequest, VerificationError
from .ids import body_key, id_header
from .spelling import NEVER, canonical_b64, hex_digest
from .verifier import MAX_SIGNATURE_ENTRIES, MAX_SIGNATURE_HEADER, VerifiedDelivery

if TYPE_CHECKING:
    from starlette.datastructures import Headers

__all__ = [
    "MAX_HEADER",
    "GitHub",
    "Shopify",
    "Slack",
    "Stripe",
    "sign_github",
    "sign_shopify",
    "sign_slack",
    "sign_stripe",
]

#: Longest value accepted for any single-valued header we read (ids, types, timestamps and the
#: one-signature headers, all under 100 characters when genuine).
MAX_HEADER = 1024

# Ids become the ledger key and types are matched against handler patterns: visible ASCII
# (RFC 5234 VCHAR) only, so a key never holds spaces, control or non-ASCII characters.
_TOKEN = re.compile(r"[\x21-\x7e]{1,255}")
# Canonical decimal only, as in _verification: the text is signed as sent, so "01" must not pass
# for 1. At most 11 digits keeps the instant inside datetime's range (up to year 5138).
_TIMESTAMP = re.compile(r"0|[1-9][0-9]{0,10}")
_MAX_SECONDS = 99_999_999_999
# Base64 of a 32-byte digest, padded, as Shopify sends it.
_B64_32 = re.compile(r"[A-Za-z0-9+/]{43}=")
# Sent on every delivery, and required by Shopify's own library (shopify-api's
# webhooks.validate), which refuses a delivery without one as its sender never sends it.
_SHOPIFY_ALWAYS = ("x-shopify-shop-domain", "x-shopify-api-version", "x-shopify-webhook-id")


# -- configuration ---------------------------------------------------------------------------------


def _key(secret: object, what: str) -> bytes:
    if isinstance(secret, bytes):
        if not secret:
            raise ConfigurationError(f"{what} is empty; give the secret from the sender")
        return secret
    if not isinstance(secret, str):
        raise ConfigurationError(f"{what} must be str or bytes, not {type(secret).__name__}")
    if not secret.strip():
        raise ConfigurationError(f"{what} is empty; give the secret from the sender")
    if secret != secret.strip():
        # Not stripped silently: a space could be part of a GitHub secret, and a newline from an
        # environment file would make every signature fail without saying why.
        raise ConfigurationError(
            f"{what} starts or ends with whitespace (a newline from an env file?): strip it, "
            "or pass bytes if the whitespace really is part of the secret"
        )
    try:
        return secret.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (bytes read with surrogateescape?): no UTF-8 for it, so no key.
        raise ConfigurationError(
            f"{what} is not valid Unicode text (it holds a lone surrogate): give the secret "
            "as the sender shows it, or pass its bytes"
        ) from None


def _keyed(secrets: Sequence[str | bytes], scheme: str) -> tuple[hmac.HMAC, ...]:
    if isinstance(secrets, str | bytes):
        # A lone string is a Sequence too; iterating it would give one "secret" per character.
        raise ConfigurationError(f"{scheme}: secrets must be a list of secrets, e.g. [secret]")
    if not secrets:
        raise ConfigurationError(f"{scheme}: no secrets configured; give at least one")
    # Keyed once here: copying a keyed HMAC skips the two key-pad blocks per request.
    return tuple(
        hmac.new(_key(secret, f"{scheme} secrets[{index}]"), digestmod=hashlib.sha256)
        for index, secret in enumerate(secrets)
    )


def _tolerance(tolerance: float, scheme: str) -> float:
    # Not a bool: an int, but True as "1 second" is always a mistake.
    number = not isinstance(tolerance, bool) and isinstance(tolerance, int | float)
    if not number or not math.isfinite(tolerance) or tolerance < 0:
        raise ConfigurationError(f"{scheme}: tolerance must be a finite number of seconds >= 0")
    return float(tolerance)


# -- reading a delivery ----------------------------------------------------------------------------


def _header(headers: Headers, name: str, check: str, limit: int = MAX_HEADER) -> str:
    """The one value of a required header; ``check`` names the failure when it is too long."""
    values = headers.getlist(name)
    if len(values) > 1:
        # Two values would leave it to us which one counts, and a proxy could pick the other.
        raise MalformedRequest(f"duplicate_header:{name}", f"{name} sent more than once")
    if not values or not values[0]:
        raise MalformedRequest(f"missing_header:{name}", f"{name} header is required")
    if len(values[0]) > limit:
        raise MalformedRequest(check, f"{name} header too long")
    return values[0]


def _token(value: str, check: str, what: str) -> str:
    if _TOKEN.fullmatch(value) is None:
        raise MalformedRequest(check, f"{what} must be 1-255 visible ASCII characters")
    return value


def _timestamp(value: str, what: str) -> int:
    if _TIMESTAMP.fullmatch(value) is None:
        raise MalformedRequest("timestamp", f"{what} must be integer unix seconds")
    return int(value)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:  # also invalid UTF-8 and nesting too deep
        return None
    return payload if isinstance(payload, dict) else None


def _iso_seconds(values: list[str]) -> int | None:
    """Unix seconds of one ISO-8601 value with an offset, else None (never an error)."""
    if len(values) != 1 or len(values[0]) > 64:
        return None
    try:
        parsed = dt.datetime.fromisoformat(values[0])
        if parsed.tzinfo is None:  # a local time of an unknown zone: no instant to speak of
            return None
        seconds = int(parsed.timestamp())
    except (ValueError, OverflowError):
        return None
    # The range the signed timestamps of the other schemes have: "0001-01-01T00:00:00+14:00"
    # is a valid ISO-8601 instant but before year 1 in UTC, which datetime cannot represent.
    return seconds if 0 <= seconds <= _MAX_SECONDS else None


# -- the schemes -----------------------------------------------------------------------------------


class _HmacScheme:
    """HMAC-SHA256 under any of several secrets: what the four schemes share."""

    __slots__ = ("_macs",)

    #: The response headers that tell the sender not to retry a delivery that failed for good;
    #: empty where the sender documents no such answer (Stripe, GitHub, Shopify: any non-2xx
    #: is retried on their schedule, or, for GitHub, never).
    stop_retry: tuple[tuple[str, str], ...] = ()

    def __init__(self, secrets: Sequence[str | bytes]) -> None:
        self._macs = _keyed(secrets, type(self).__name__)

    def _matches(self, given: Sequence[bytes], *parts: bytes) -> bool:
        """Whether any given digest is the HMAC of ``parts`` under any secret."""
        for keyed in self._macs:
            mac = keyed.copy()
            for part in parts:
                mac.update(part)  # several updates instead of a concatenation: no body copy
            expected = mac.digest()
            for digest in given:
                if hmac.compare_digest(expected, digest):
                    return True
        return False

    def _verify(self, given: Sequence[bytes], *parts: bytes) -> None:
        if not self._matches(given, *parts):
            raise VerificationError("signature", "no valid signature for the configured secrets")

    def __repr__(self) -> str:
        # A count only: the keys must never reach a log line or a traceback.
        return f"{type(self).__name__}(secrets={len(self._macs)})"


class _TimedScheme(_HmacScheme):
    """A scheme that signs a timestamp, checked in both directions."""

    __slots__ = ("tolerance",)

    def __init__(self, secrets: Sequence[str | bytes], *, tolerance: float = 300.0) -> None:
        super().__init__(secrets)
        self.tolerance = _tolerance(tolerance, type(self).__name__)

    def _check_time(self, timestamp: int, now: float) -> None:
        if now - timestamp > self.tolerance:
            raise VerificationError("timestamp", "timestamp too old")
        if timestamp - now > self.tolerance:
            raise VerificationError("timestamp", "timestamp too new")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(secrets={len(self._macs)}, tolerance={self.tolerance})"


class Stripe(_TimedScheme):
    """Verifies Stripe's ``Stripe-Signature``; the id is the body's event ``"id"``."""

    __slots__ = ()

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "stripe-signature", "signature", MAX_SIGNATURE_HEADER)
        stamp: str | None = None
        given: list[bytes] = []
        for element in value.split(","):
            key, _, item = element.partition("=")
            if key == "t":
                if stamp is not None:
                    raise MalformedRequest("timestamp", "Stripe-Signature has more than one t=")
                stamp = item
            elif key == "v1":
                digest = hex_digest(item, "")
                if digest is not None:  # as with unknown schemes, a malformed entry is skipped
                    given.append(digest)
        if stamp is None:
            raise MalformedRequest("timestamp", "Stripe-Signature has no t= timestamp")
        timestamp = _timestamp(stamp, "Stripe-Signature t=")
        if not given:
            raise MalformedRequest("signature", "Stripe-Signature has no v1=<64 hex digits>")
        if len(given) > MAX_SIGNATURE_ENTRIES:
            raise MalformedRequest("signature", "Stripe-Signature lists too many signatures")
        self._check_time(timestamp, now)
        self._verify(given, stamp.encode("ascii"), b".", body)
        return VerifiedDelivery(self.key_of(body, ""), timestamp)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key: the signed body's event ``"id"`` (``sender_id`` is not used)."""
        payload = _json_object(body)
        event_id = None if payload is None else payload.get("id")
        if not isinstance(event_id, str) or _TOKEN.fullmatch(event_id) is None:
            raise MalformedRequest(
                "event_id", 'the body must be a JSON object with a string "id" (1-255 ASCII)'
            )
        return event_id


class GitHub(_HmacScheme):
    """Verifies GitHub's ``X-Hub-Signature-256``; the key is ``X-GitHub-Delivery``."""

    __slots__ = ()

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "x-hub-signature-256", "signature")
        event = _header(headers, "x-github-event", "event_type")
        _token(event, "event_type", "X-GitHub-Event")
        digest = hex_digest(value, "sha256=")
        if digest is None:
            raise MalformedRequest("signature", "X-Hub-Signature-256 must be sha256=<64 hex>")
        self._verify((digest,), body)
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/x-www-form-urlencoded":
            # Its JSON sits in a "payload" field, and the type's action cannot be read: say
            # what to change rather than run handlers on a payload of one string.
            raise MalformedRequest(
                "content_type",
                "the webhook's content type is form-encoded: set it to application/json in "
                "the webhook's settings",
            )

        # Most bodies (push, for one) have no action: skip a parse of a large body for them.
        payload = _json_object(body) if b'"action"' in body else None
        action = None if payload is None else payload.get("action")
        if isinstance(action, str) and action:
            event = _token(f"{event}.{action}", "event_type", 'X-GitHub-Event + "." + action')
        return VerifiedDelivery(id_header(headers, ("x-github-delivery",)), None, event)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key of a delivery the caller vouches for: ``sender_id``, its
        ``X-GitHub-Delivery``."""
        return _token(sender_id, "webhook_id", "the X-GitHub-Delivery")

    def legacy_key(self, body: bytes) -> str:
        """The key this delivery had in ledgers written when the key was the body's digest."""
        return body_key(body)


class Shopify(_HmacScheme):
    """Verifies Shopify's ``X-Shopify-Hmac-Sha256``; the key is ``X-Shopify-Event-Id``."""

    __slots__ = ()

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "x-shopify-hmac-sha256", "signature")
        topic = _header(headers, "x-shopify-topic", "event_type")
        _token(topic, "event_type", "X-Shopify-Topic")
        for name in _SHOPIFY_ALWAYS:
            # Never read here (so of any length), only required once, as Shopify's library does.
            _header(headers, name, "webhook_id", limit=MAX_SIGNATURE_HEADER * 8)
        if _B64_32.fullmatch(value) is None:
            raise MalformedRequest("signature", "X-Shopify-Hmac-Sha256 must be base64 of 32 bytes")
        self._verify((canonical_b64(value.encode("ascii")) or NEVER,), body)
        timestamp = _iso_seconds(headers.getlist("x-shopify-triggered-at"))
        shopify_id = id_header(headers, ("x-shopify-event-id", "x-shopify-webhook-id"))
        return VerifiedDelivery(shopify_id, timestamp, topic)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key of a delivery the caller vouches for: ``sender_id``, its
        ``X-Shopify-Event-Id``."""
        return _token(sender_id, "webhook_id", "the X-Shopify-Event-Id")

    def legacy_key(self, body: bytes) -> str:
        """The key this delivery had in ledgers written when the key was the body's digest."""
        return body_key(body)


class Slack(_TimedScheme):
    """Verifies Slack's ``X-Slack-Signature`` on Events API deliveries; the id is the body's
    ``"event_id"``."""

    __slots__ = ()

    #: A response with this header is not retried by the Events API ("Turning retries off",
    #: https://api.slack.com/events-api#the-events-api__field-guide__error-handling__graceful-retries__turning-retries-off).
    stop_retry: tuple[tuple[str, str], ...] = (("x-slack-no-retry", "1"),)

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "x-slack-signature", "signature")
        stamp = _header(headers, "x-slack-request-timestamp", "timestamp")
        timestamp = _timestamp(stamp, "X-Slack-Request-Timestamp")
        digest = hex_digest(value, "v0=")
        if digest is None:
            raise MalformedRequest("signature", "X-Slack-Signature must be v0=<64 hex digits>")
        self._check_time(timestamp, now)
        self._verify((digest,), b"v0:", stamp.encode("ascii"), b":", body)
        event_id, event_type = self._event(body)
        return VerifiedDelivery(event_id, timestamp, event_type)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key: the signed body's ``"event_id"`` (``sender_id`` is not used)."""
        return self._event(body)[0]

    @staticmethod
    def _event(body: bytes) -> tuple[str, str]:
        payload = _json_object(body)
        if payload is None:
            raise MalformedRequest(
                "event_id", "the body is not a JSON object: only Events API deliveries are handled"
            )
        kind = payload.get("type")
        event = payload.get("event")
        inner = event.get("type") if isinstance(event, dict) else None
        event_type = inner if isinstance(inner, str) else kind
        if not isinstance(event_type, str):
            raise MalformedRequest("event_type", 'the body has no string "type"')
        _token(event_type, "event_type", "the event type")
        if "event_id" in payload or kind == "event_callback":
            event_id = payload.get("event_id")
        elif isinstance(kind, str):
            # url_verification and app_rate_limited carry no id: the same body is the same
            # delivery, so Slack re-sending a handshake gets the stored answer.
            event_id = f"{kind}:{hashlib.sha256(body).hexdigest()}"
        else:
            event_id = None
        if not isinstance(event_id, str) or _TOKEN.fullmatch(event_id) is None:
            raise MalformedRequest(
                "event_id", 'the body must have a string "event_id" (1-255 visible ASCII)'
            )
        return event_id, event_type


# -- signing, for tests and for sending ------------------------------------------------------------


def _digest(secret: str | bytes, *parts: bytes) -> bytes:
    mac = hmac.new(_key(secret, "secret"), digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


def sign_stripe(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """Return a ``Stripe-Signature`` value, ``"t=<timestamp>,v1=<hex>"``."""
    digest = _digest(secret, f"{timestamp}.".encode("ascii"), body)
    return f"t={timestamp},v1={digest.hex()}"


def sign_github(secret: str | bytes, body: bytes) -> str:
    """Return an ``X-Hub-Signature-256`` value, ``"sha256=<hex>"``."""
    return "sha256=" + _digest(secret, body).hex()


def sign_shopify(secret: str | bytes, body: bytes) -> str:
    """Return an ``X-Shopify-Hmac-Sha256`` value, the base64 HMAC-SHA256 of the body."""
    return base64.b64encode(_digest(secret, body)).decode("ascii")


def sign_slack(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """Return an ``X-Slack-Signature`` value, ``"v0=<hex>"``; send ``timestamp`` as
    ``X-Slack-Request-Timestamp``."""
    return "v0=" + _digest(secret, f"v0:{timestamp}:".encode("ascii"), body).hex()
