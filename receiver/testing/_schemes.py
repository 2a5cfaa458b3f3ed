"""How each built-in scheme's sender shapes and signs a delivery.

The body of an event is built once and kept: a sender retries with the same bytes (a changed
body under the same id would be a payload mismatch, 422), but signs every attempt again with
the time of that attempt, as Svix, Stripe and Slack do. Each scheme puts the id and the type
where its verifier (receiver/_verification/schemes.py, receiver/_verification/verifier.py)
reads them:

    scheme             id                        type
    standard-webhooks  webhook-id header         body "type"
    stripe             body "id"                 body "type"
    github             X-GitHub-Delivery         X-GitHub-Event [+ "." + body "action"]
    shopify            X-Shopify-Webhook-Id      X-Shopify-Topic
    slack              body "event_id"           body event.type
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from .._exceptions import ConfigurationError
from .._verification.schemes import (
    GitHub,
    Shopify,
    Slack,
    Stripe,
    sign_github,
    sign_shopify,
    sign_slack,
    sign_stripe,
)
from .._verification.verifier import StandardWebhooks, Verifier, sign

Headers = list[tuple[str, str]]

SCHEMES = ("standard-webhooks", "stripe", "github", "shopify", "slack")


@dataclass(frozen=True, slots=True)
class Webhook:
    """One event as its sender delivers it, every time: the same id, type and body bytes."""

    provider: str
    id: str
    type: str
    body: bytes

    def __repr__(self) -> str:  # short: hypothesis prints it in every falsifying example
        return f"Webhook({self.provider}/{self.id} {self.type})"


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).isoformat().replace("+00:00", "Z")


def _json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise ConfigurationError(f"the event's data must encode as JSON: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Scheme:
    """A sender's envelope and signature."""

    name: str
    id_prefix: str
    #: (id, type, data, created) -> body bytes
    body: Callable[[str, str, Any, float], bytes]
    #: (webhook, signing time, secret) -> headers
    headers: Callable[[Webhook, int, str | bytes], Headers]


def _standard_headers(w: Webhook, ts: int, secret: str | bytes) -> Headers:
    return [
        ("webhook-id", w.id),
        ("webhook-timestamp", str(ts)),
        ("webhook-signature", sign(secret, w.id, ts, w.body)),
    ]


def _github_body(id_: str, type_: str, data: Any, created: float) -> bytes:
    _, _, action = type_.partition(".")
    payload = dict(data or {})
    if action:
        payload["action"] = action  # GitHub's event header names the kind, the body the action
    return _json(payload)


def _github_headers(w: Webhook, ts: int, secret: str | bytes) -> Headers:
    return [
        ("x-hub-signature-256", sign_github(secret, w.body)),
        ("x-github-delivery", w.id),
        ("x-github-event", w.type.partition(".")[0]),
    ]


def _shopify_headers(w: Webhook, ts: int, secret: str | bytes) -> Headers:
    return [
        ("x-shopify-hmac-sha256", sign_shopify(secret, w.body)),
        ("x-shopify-webhook-id", w.id),
        ("x-shopify-topic", w.type),
        ("x-shopify-triggered-at", _iso(ts)),
    ]


def _slack_headers(w: Webhook, ts: int, secret: str | bytes) -> Headers:
    return [
        ("x-slack-signature", sign_slack(secret, ts, w.body)),
        ("x-slack-request-timestamp", str(ts)),
    ]


_ALL = {
    "standard-webhooks": Scheme(
        "standard-webhooks",
        "msg_",
        lambda i, t, d, c: _json({"type": t, "timestamp": _iso(c), "data": d}),
        _standard_headers,
    ),
    "stripe": Scheme(
        "stripe",
        "evt_",
        lambda i, t, d, c: _json(
            {"id": i, "object": "event", "type": t, "created": int(c), "data": {"object": d}}
        ),
        lambda w, ts, s: [("stripe-signature", sign_stripe(s, ts, w.body))],
    ),
    "github": Scheme("github", "gh-", _github_body, _github_headers),
    "shopify": Scheme("shopify", "shp-", lambda i, t, d, c: _json(d or {}), _shopify_headers),
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
    ]
    for kind, name in kinds:
        if isinstance(verifier, kind):
            return _ALL[name]
    raise ConfigurationError(
        f"no built-in sender signs for {type(verifier).__name__}: pass scheme= "
        f"(one of {', '.join(SCHEMES)})"
    )
