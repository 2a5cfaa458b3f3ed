"""Verifiers for Paddle Billing, Zoom and Linear: HMAC-SHA256 under a shared secret, each with
its own envelope. Same rules as :mod:`receiver._verification.schemes` (secrets as ``str`` or
``bytes``, several for rotation; total verification; messages never hold secrets or values):

    scheme  signature header                      signed content      timestamp (checked both ways)
    Paddle  Paddle-Signature: ts=<unix>;h1=<hex>  b"{ts}:" + body     ts
    Zoom    x-zm-signature: v0=<hex>              b"v0:{ts}:" + body  x-zm-request-timestamp
    Linear  Linear-Signature: <hex>               body                body "webhookTimestamp" (ms)

    scheme  id (the ledger key)                       event type
    Paddle  body "event_id" (evt_...)                 body "event_type"
    Zoom    "{event}:{event_ts}:{body digest}"        body "event"
    Linear  sha256 of the payload but its timestamp   body "type" [+ "." + "action"]

Paddle (https://developer.paddle.com/webhooks/signature-verification): the header may carry one
``h1`` per secret while a secret is rotated; any may match. Any other element (another scheme,
a space before a key, a second ``=``) fails the whole header, as in Paddle's SDKs (401).
Paddle's SDKs allow 5 seconds of clock difference; the default here is the 5 minutes of every
other scheme (``tolerance=5`` to match the SDKs). The id is the event's ``event_id``, the same
on every retry and on a manual replay of the notification (``notification_id`` is per
destination and per replay).

Zoom (https://developers.zoom.us/docs/api/webhooks/#verify-webhook-events): Zoom sends no event
id, so the id is the event name, its ``event_ts`` and the first 16 bytes of the body's SHA-256:
a retry resends the same body, and two distinct events differ in their millisecond timestamp.
``x-zm-request-timestamp`` is unix seconds (milliseconds are accepted too: 13 digits).
``endpoint.url_validation`` (the challenge Zoom sends when the URL is saved and every 72 hours)
is signed like any event and goes through the ledger; answer it with
:meth:`Zoom.url_validation` from a handler registered for that type.

Linear (https://linear.app/developers/webhooks, "Securing webhooks"; the SDK's
``LinearWebhookClient.verify``): the signature covers the body only and the timestamp lives in
the signed body (``webhookTimestamp``, milliseconds), so the signature is checked first and the
clock after it; the SDK allows one minute either way, which is the default here. The
``Linear-Delivery`` header is not signed, and Linear documents it as unique per delivery, not
as kept on a retry, so it is only the delivery's hint: the ledger key is ``"sha256:"`` and the
hex SHA-256 of the normalized payload without its ``webhookTimestamp`` (the one field Linear
refreshes on each attempt), the same digest as the payload's fingerprint. Distinct events
differ in it: every payload carries the event's ``createdAt`` and the entity's state (its
``updatedAt``, and ``updatedFrom`` on an update). A retry lands on the key of its first
attempt; a capture re-sent under a new ``Linear-Delivery`` lands there too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._exceptions import MalformedRequest, VerificationError
from .ids import hint as _hint
from .payload import ATTEMPT_FIELD, NotJSON, normalized
from .schemes import (
    _TOKEN,
    _digest,
    _header,
    _json_object,
    _TimedScheme,
    _timestamp,
    _token,
)
from .spelling import hex_digest
from .verifier import MAX_SIGNATURE_ENTRIES, MAX_SIGNATURE_HEADER, VerifiedDelivery

if TYPE_CHECKING:
    from starlette.datastructures import Headers

__all__ = ["Linear", "Paddle", "Zoom", "sign_linear", "sign_paddle", "sign_zoom"]

# Seconds (at most 11 digits, as the other schemes) or milliseconds (13 digits).
_ZOOM_STAMP = re.compile(r"0|[1-9][0-9]{0,10}|[1-9][0-9]{12}")


def _event_fields(body: bytes, id_field: str, type_field: str) -> tuple[str, str]:
    payload = _json_object(body)
    event_id = None if payload is None else payload.get(id_field)
    event_type = None if payload is None else payload.get(type_field)
    if not isinstance(event_id, str) or _TOKEN.fullmatch(event_id) is None:
        raise MalformedRequest(
            "event_id", f'the body must be a JSON object with a string "{id_field}" (1-255 ASCII)'
        )
    if not isinstance(event_type, str):
        raise MalformedRequest("event_type", f'the body has no string "{type_field}"')
    return event_id, _token(event_type, "event_type", f'"{type_field}"')


class Paddle(_TimedScheme):
    """Verifies Paddle Billing's ``Paddle-Signature``; the id is the body's ``event_id``."""

    __slots__ = ()

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "paddle-signature", "signature", MAX_SIGNATURE_HEADER)
        stamp: str | None = None
        given: list[bytes] = []
        for element in value.split(";"):
            if "=" not in element:
                continue  # as Paddle's SDKs do: an element without "=" is no element
            key, _, item = element.partition("=")
            if key == "ts":
                if stamp is not None:
                    raise MalformedRequest("timestamp", "Paddle-Signature has more than one ts=")
                stamp = item
            elif key == "h1" and "=" not in item:
                digest = hex_digest(item, "")
                if digest is not None:  # a malformed entry is skipped
                    given.append(digest)
            else:
                # Paddle's SDKs refuse the whole header for an element they do not know (a
                # space before a key, a second "=", a scheme other than h1): so does this.
                raise VerificationError("signature", "Paddle-Signature has an unknown element")
        if stamp is None:
            raise MalformedRequest("timestamp", "Paddle-Signature has no ts= timestamp")
        timestamp = _timestamp(stamp, "Paddle-Signature ts=")
        if not given:
            raise MalformedRequest("signature", "Paddle-Signature has no h1=<64 hex digits>")
        if len(given) > MAX_SIGNATURE_ENTRIES:
            raise MalformedRequest("signature", "Paddle-Signature lists too many signatures")
        self._check_time(timestamp, now)
        self._verify(given, stamp.encode("ascii"), b":", body)
        event_id, event_type = _event_fields(body, "event_id", "event_type")
        return VerifiedDelivery(event_id, timestamp, event_type)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key: the signed body's ``"event_id"`` (``sender_id`` is not used)."""
        return _event_fields(body, "event_id", "event_type")[0]


class Zoom(_TimedScheme):
    """Verifies Zoom's ``x-zm-signature``; the id is made from the event (Zoom sends none)."""

    __slots__ = ()

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "x-zm-signature", "signature")
        stamp = _header(headers, "x-zm-request-timestamp", "timestamp")
        if _ZOOM_STAMP.fullmatch(stamp) is None:
            raise MalformedRequest("timestamp", "x-zm-request-timestamp must be unix seconds")
        timestamp = int(stamp) // 1000 if len(stamp) == 13 else int(stamp)
        digest = hex_digest(value, "v0=")
        if digest is None:
            raise MalformedRequest("signature", "x-zm-signature must be v0=<64 hex digits>")
        self._check_time(timestamp, now)
        self._verify((digest,), b"v0:", stamp.encode("ascii"), b":", body)
        event_id, event = self._event(body)
        return VerifiedDelivery(event_id, timestamp, event)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key, made from the signed event (``sender_id`` is not used)."""
        return self._event(body)[0]

    @staticmethod
    def _event(body: bytes) -> tuple[str, str]:
        payload = _json_object(body)
        event = None if payload is None else payload.get("event")
        event_ts = None if payload is None else payload.get("event_ts")
        if not isinstance(event, str):
            raise MalformedRequest("event_type", 'the body has no string "event"')
        _token(event, "event_type", '"event"')
        if isinstance(event_ts, bool) or not isinstance(event_ts, int):
            raise MalformedRequest("event_id", 'the body has no integer "event_ts"')
        event_id = f"{event}:{event_ts}:{hashlib.sha256(body).hexdigest()[:32]}"
        return _token(event_id, "event_id", "the Zoom event id"), event

    def url_validation(self, payload: Mapping[str, Any]) -> dict[str, str]:
        """The answer to an ``endpoint.url_validation`` event, signed with the first (current)
        secret: ``{"plainToken": ..., "encryptedToken": <hex HMAC-SHA256>}``."""
        inner = payload.get("payload") if "payload" in payload else payload
        token = inner.get("plainToken") if isinstance(inner, Mapping) else None
        if not isinstance(token, str) or not token:
            raise MalformedRequest("event_type", 'the validation event has no "plainToken"')
        mac = self._macs[0].copy()
        mac.update(token.encode("utf-8"))
        return {"plainToken": token, "encryptedToken": mac.hexdigest()}


class Linear(_TimedScheme):
    """Verifies Linear's ``Linear-Signature``; the id is a digest of the signed payload."""

    __slots__ = ()

    #: Linear's time of the attempt, in the signed body: not part of the event's fingerprint.
    attempt_field = ATTEMPT_FIELD

    def __init__(self, secrets: Any, *, tolerance: float = 60.0) -> None:
        super().__init__(secrets, tolerance=tolerance)

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        value = _header(headers, "linear-signature", "signature")
        digest = hex_digest(value, "")
        if digest is None:
            raise MalformedRequest("signature", "Linear-Signature must be 64 hex digits")
        self._verify((digest,), body)

        payload = _json_object(body)
        millis = None if payload is None else payload.get("webhookTimestamp")
        if isinstance(millis, bool) or not isinstance(millis, int) or not 0 <= millis < 10**14:
            raise MalformedRequest("timestamp", 'the body has no integer "webhookTimestamp"')
        # Milliseconds: compared as such, so that a 59.9 s skew is not rounded into a refusal.
        skew = now * 1000 - millis
        if skew > self.tolerance * 1000:
            raise VerificationError("timestamp", "webhookTimestamp too old")
        if -skew > self.tolerance * 1000:
            raise VerificationError("timestamp", "webhookTimestamp too new")
        assert payload is not None
        kind = payload.get("type")
        action = payload.get("action")
        if not isinstance(kind, str):
            raise MalformedRequest("event_type", 'the body has no string "type"')
        event_type = f"{kind}.{action}" if isinstance(action, str) and action else kind
        _token(event_type, "event_type", '"type" + "." + "action"')
        hint = _hint(headers, "linear-delivery")
        return VerifiedDelivery(self.key_of(body, ""), millis // 1000, event_type, hint)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The ledger key: the digest of the signed payload without ``webhookTimestamp``
        (``sender_id`` is not used)."""
        try:
            _, form = normalized(body, attempt_field=ATTEMPT_FIELD)
        except NotJSON:
            raise MalformedRequest("event_id", "the body is not a JSON payload") from None
        return "sha256:" + hashlib.sha256(form).hexdigest()


# -- signing, for tests and for sending ------------------------------------------------------------


def sign_paddle(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """Return a ``Paddle-Signature`` value, ``"ts=<timestamp>;h1=<hex>"``."""
    return f"ts={timestamp};h1={_digest(secret, f'{timestamp}:'.encode('ascii'), body).hex()}"


def sign_zoom(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """Return an ``x-zm-signature`` value, ``"v0=<hex>"``; send ``timestamp`` as
    ``x-zm-request-timestamp``."""
    return "v0=" + _digest(secret, f"v0:{timestamp}:".encode("ascii"), body).hex()


def sign_linear(secret: str | bytes, body: bytes) -> str:
    """Return a ``Linear-Signature`` value, the hex HMAC-SHA256 of the body."""
    return _digest(secret, body).hex()
