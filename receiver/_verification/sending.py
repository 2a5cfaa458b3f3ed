"""How each built-in scheme's sender shapes and signs a delivery.

The body of an event is built once and kept: a sender retries with the same bytes (a changed
body under the same id would be a payload mismatch, 422), but signs every attempt again with
the time of that attempt, as Svix, Stripe and Slack do. Each scheme puts the id and the type
where its verifier (receiver/_verification/schemes.py, receiver/_verification/verifier.py)
reads them:

    scheme             id (the ledger key)          type
    standard-webhooks  webhook-id header            body "type"
    svix               svix-id header               body "type" (Svix's default header names)
    stripe             body "id"                    body "type"
    github             X-GitHub-Delivery            X-GitHub-Event [+ "." + body "action"]
    shopify            X-Shopify-Event-Id           X-Shopify-Topic
    slack              body "event_id"              body event.type
    paddle             body "event_id"              body "event_type"
    zoom               made from the event          body "event"
    linear             sha256 of the payload        body "type" + "." + "action"
    twilio             I-Twilio-Idempotency-Token   "call.<CallStatus>" / "message.<MessageStatus>"

GitHub, Shopify and Twilio send their event id in a header the signature does not cover; the
kit sends its own id there. Linear sends one too (Linear-Delivery) beside a key made from the
signed payload: the kit sends its own id there (``Webhook.sender_id``). The kit puts the id in
the body too (as the event's ``"id"``, or its sid), so that two events with the same data are
two bodies, as a real sender's are.

Two senders change the body between attempts, as the real ones do: Linear refreshes
``webhookTimestamp`` in the signed body on every attempt (the receiver leaves it out of the
fingerprint), and Twilio posts a form, not JSON, signed over the URL it requests.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from .._exceptions import ConfigurationError
from .schemes import (
    GitHub,
    Shopify,
    Slack,
    Stripe,
    sign_github,
    sign_shopify,
    sign_slack,
    sign_stripe,
)
from .senders import Linear, Paddle, Zoom, sign_linear, sign_paddle, sign_zoom
from .twilio import Twilio, sign_twilio
from .verifier import StandardWebhooks, Verifier, sign

Headers = list[tuple[str, str]]

SCHEMES = (
    "standard-webhooks",
    "svix",
    "stripe",
    "github",
    "shopify",
    "slack",
    "paddle",
    "zoom",
    "linear",
    "twilio",
)


@dataclass(frozen=True, slots=True)
class Webhook:
    """One event as its sender delivers it, every time: the same id, type and body bytes."""

    provider: str
    #: The ledger key the receiver gives it.
    id: str
    type: str
    body: bytes
    #: The sender's own delivery id, where it sends one the signature does not cover (GitHub,
    #: Shopify, Linear, Twilio): a header the receiver only logs. Else the same as ``id``.
    sender_id: str = ""

    @property
    def delivery_id(self) -> str:
        """The id header the sender puts on the wire."""
        return self.sender_id or self.id

    def __repr__(self) -> str:  # short: hypothesis prints it in every falsifying example
        return f"Webhook({self.provider}/{self.id} {self.type})"


def _zoom_id(_: str, body: bytes) -> str:
    """The id Zoom's verifier makes: event, event_ts and a digest of the body."""
    payload = orjson.loads(body)
    return f"{payload['event']}:{payload['event_ts']}:{hashlib.sha256(body).hexdigest()[:32]}"


def _linear_body(id_: str, type_: str, data: Any, created: float) -> bytes:
    kind, _, action = type_.partition(".")
    payload: dict[str, Any] = {
        "action": action or "update",
        "type": kind,
        "data": {"id": id_, **(data or {})},
    }
    payload["createdAt"] = _iso(created)
    payload["organizationId"] = "kit-organization"
    payload["webhookTimestamp"] = int(created * 1000)
    return _json(payload)


_LINEAR_STAMP = re.compile(rb'"webhookTimestamp":\d+')


def _linear_attempt(body: bytes, ts: int) -> bytes:
    """Linear dates each attempt inside the signed body."""
    return _LINEAR_STAMP.sub(b'"webhookTimestamp":%d' % (ts * 1000), body, count=1)


def _twilio_body(id_: str, type_: str, data: Any, created: float) -> bytes:
    kind, _, status = type_.partition(".")
    params = {str(k): str(v) for k, v in (data or {}).items()}
    params.setdefault("AccountSid", "ACkit0000000000000000000000000000")
    if kind == "call" and status:
        params.setdefault("CallSid", "CA" + id_)
        params["CallStatus"] = status
    else:
        params.setdefault("MessageSid", "SM" + id_)
        if kind == "message" and status:
            params["MessageStatus"] = status
    return urllib.parse.urlencode(sorted(params.items())).encode("ascii")


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).isoformat().replace("+00:00", "Z")


def _json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise ConfigurationError(f"the event's data must encode as JSON: {exc}") from exc


def _unchanged(body: bytes, ts: int) -> bytes:
    return body


def _own_id(webhook_id: str, body: bytes) -> str:
    return webhook_id


def _linear_id(_: str, body: bytes) -> str:
    return Linear([b"kit"]).key_of(body, "")


@dataclass(frozen=True, slots=True)
class Scheme:
    """A sender's envelope and signature."""

    name: str
    id_prefix: str
    #: (id, type, data, created) -> body bytes
    body: Callable[[str, str, Any, float], bytes]
    #: (webhook, attempt's body, signing time, secret, URL requested) -> headers
    headers: Callable[[Webhook, bytes, int, str | bytes, str], Headers]
    #: The body of one attempt signed at a time (Linear refreshes a field in it).
    attempt: Callable[[bytes, int], bytes] = _unchanged
    #: The id the receiver will see, from the kit's id and the body (Zoom sends none).
    id_of: Callable[[str, bytes], str] = _own_id
    content_type: str = "application/json"


def _standard_headers(w: Webhook, body: bytes, ts: int, secret: str | bytes, url: str) -> Headers:
    return [
        ("webhook-id", w.id),
        ("webhook-timestamp", str(ts)),
        ("webhook-signature", sign(secret, w.id, ts, body)),
    ]


def _svix_headers(w: Webhook, body: bytes, ts: int, secret: str | bytes, url: str) -> Headers:
    """Standard Webhooks as Svix sends it by default: the same signature, under Svix's names."""
    return [
        (name.replace("webhook-", "svix-"), value)
        for name, value in _standard_headers(w, body, ts, secret, url)
    ]


def _github_body(id_: str, type_: str, data: Any, created: float) -> bytes:
    _, _, action = type_.partition(".")
    payload = {"id": id_, **(data or {})}
    if action:
        payload["action"] = action  # GitHub's event header names the kind, the body the action
    return _json(payload)


def _github_headers(w: Webhook, body: bytes, ts: int, secret: str | bytes, url: str) -> Headers:
    return [
        ("x-hub-signature-256", sign_github(secret, body)),
        ("x-github-delivery", w.delivery_id),
        ("x-github-event", w.type.partition(".")[0]),
    ]


def _shopify_headers(w: Webhook, body: bytes, ts: int, secret: str | bytes, url: str) -> Headers:
    return [
        ("x-shopify-hmac-sha256", sign_shopify(secret, body)),
        ("x-shopify-event-id", w.delivery_id),
        ("x-shopify-webhook-id", "wh-" + w.delivery_id),
        ("x-shopify-topic", w.type),
        ("x-shopify-triggered-at", _iso(ts)),
        # Sent on every delivery; Shopify's library, and so the verifier, refuse one without.
        ("x-shopify-shop-domain", "kit.myshopify.com"),
        ("x-shopify-api-version", "2026-10"),
    ]


def _slack_headers(w: Webhook, body: bytes, ts: int, secret: str | bytes, url: str) -> Headers:
    return [
        ("x-slack-signature", sign_slack(secret, ts, body)),
        ("x-slack-request-timestamp", str(ts)),
    ]


_ALL = {
    "standard-webhooks": Scheme(
        "standard-webhooks",
        "msg_",
        lambda i, t, d, c: _json({"type": t, "timestamp": _iso(c), "data": d}),
        _standard_headers,
    ),
    "svix": Scheme(
        "svix",
        "msg_",
        lambda i, t, d, c: _json({"type": t, "timestamp": _iso(c), "data": d}),
        _svix_headers,
    ),
    "stripe": Scheme(
        "stripe",
        "evt_",
        lambda i, t, d, c: _json(
            {"id": i, "object": "event", "type": t, "created": int(c), "data": {"object": d}}
        ),
        lambda w, b, ts, s, u: [("stripe-signature", sign_stripe(s, ts, b))],
    ),
    "github": Scheme("github", "gh-", _github_body, _github_headers),
    "shopify": Scheme(
        "shopify",
        "shp-",
        lambda i, t, d, c: _json({"id": i, **(d or {})}),
        _shopify_headers,
    ),
    "slack": Scheme(
        "slack",
        "Ev",
        lambda i, t, d, c: _json(
            {
                "type": "event_callback",
                "event_id": i,
                "event_time": int(c),
                "team_id": "T0TESTKIT",
                "event": {**(d or {}), "type": t},
            }
        ),
        _slack_headers,
    ),
}

_ALL.update(
    {
        "paddle": Scheme(
            "paddle",
            "evt_",
            lambda i, t, d, c: _json(
                {
                    "event_id": i,
                    "event_type": t,
                    "occurred_at": _iso(c),
                    "notification_id": "ntf_" + i.removeprefix("evt_"),
                    "data": d,
                }
            ),
            lambda w, b, ts, s, u: [("paddle-signature", sign_paddle(s, ts, b))],
        ),
        "zoom": Scheme(
            "zoom",
            "zm-",
            lambda i, t, d, c: _json(
                {"event": t, "event_ts": int(c * 1000), "payload": {"account_id": i, "object": d}}
            ),
            lambda w, b, ts, s, u: [
                ("x-zm-signature", sign_zoom(s, ts, b)),
                ("x-zm-request-timestamp", str(ts)),
            ],
            id_of=_zoom_id,
        ),
        "linear": Scheme(
            "linear",
            "lin-",
            _linear_body,
            lambda w, b, ts, s, u: [
                ("linear-signature", sign_linear(s, b)),
                ("linear-delivery", w.delivery_id),
                ("linear-event", w.type.partition(".")[0]),
            ],
            attempt=_linear_attempt,
            id_of=_linear_id,
        ),
        "twilio": Scheme(
            "twilio",
            "idem-",
            _twilio_body,
            lambda w, b, ts, s, u: [
                (
                    "x-twilio-signature",
                    sign_twilio(s, u, urllib.parse.parse_qsl(b.decode(), keep_blank_values=True)),
                ),
                ("i-twilio-idempotency-token", w.delivery_id),
            ],
            content_type="application/x-www-form-urlencoded",
        ),
    }
)


def scheme(name: str) -> Scheme:
    """A scheme by name: one of :data:`SCHEMES`."""
    try:
        return _ALL[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown scheme {name!r}; the sender knows {', '.join(SCHEMES)}"
        ) from None


def scheme_of(verifier: Verifier) -> Scheme:
    """The scheme a configured provider's verifier checks."""
    kinds: list[tuple[type, str]] = [
        (StandardWebhooks, "standard-webhooks"),
        (Stripe, "stripe"),
        (GitHub, "github"),
        (Shopify, "shopify"),
        (Slack, "slack"),
        (Paddle, "paddle"),
        (Zoom, "zoom"),
        (Linear, "linear"),
        (Twilio, "twilio"),
    ]
    for kind, name in kinds:
        if isinstance(verifier, kind):
            return _ALL[name]
    raise ConfigurationError(
        f"no built-in sender signs for {type(verifier).__name__}: pass scheme= "
        f"(one of {', '.join(SCHEMES)})"
    )
