"""The differential corpus of tests/unit/test_official_verifiers.py: for each scheme, a genuine
delivery (signed by the sender's own signing helper where it has one: Svix's ``Webhook.sign``,
Stripe's ``generate_signature_header``, Slack's ``generate_signature``, Twilio's
``compute_signature``, @octokit/webhooks-methods' ``sign``; by the documented HMAC elsewhere)
first, then its mutations, each a named Case."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
from dataclasses import dataclass

import orjson
import stripe
import svix
from slack_sdk.signature import SignatureVerifier
from twilio.request_validator import RequestValidator

from tests import official

SVIX_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SECRET = "the-shared-secret"
TWILIO_URL = "https://example.com/webhooks/twilio"

Pairs = list[tuple[str, str]]


@dataclass(frozen=True)
class Case:
    name: str
    headers: Pairs
    body: bytes


def _replace(pairs: Pairs, name: str, value: str | None) -> Pairs:
    """``pairs`` with ``name``'s value replaced (or the header dropped, for None)."""
    out = [(n, value if n == name else v) for n, v in pairs]
    return [(n, v) for n, v in out if v is not None]


def _upper_one(digits: str) -> str:
    index = next(i for i, c in enumerate(digits) if c in "abcdef")
    return digits[:index] + digits[index].upper() + digits[index + 1 :]


def _odd_bits(encoded: str) -> str:
    """The same bytes in base64 whose last character carries non-zero unused bits."""
    pad = len(encoded) - len(encoded.rstrip("="))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = encoded[-pad - 1]
    bumped = alphabet[alphabet.index(last) + 1]
    return encoded[: -pad - 1] + bumped + "=" * pad


def _b64_variants(encoded: str) -> dict[str, str]:
    urlsafe = encoded.replace("+", "-").replace("/", "_")
    return {
        "base64 with non-zero final bits": _odd_bits(encoded),
        "base64 unpadded": encoded.rstrip("="),
        "base64 with extra padding": encoded + "==",
        "base64 url-safe alphabet": urlsafe if urlsafe != encoded else "-" + encoded[1:],
        "base64 with a space inside": encoded[:20] + " " + encoded[20:],
        "base64 with a newline inside": encoded[:20] + "\n" + encoded[20:],
    }


def _hex_variants(prefix: str, digits: str) -> dict[str, str]:
    return {
        "hex upper-case": prefix + digits.upper(),
        "hex with one upper-case digit": prefix + _upper_one(digits),
        "hex with a space inside": prefix + digits[:32] + " " + digits[32:],
        "hex truncated": prefix + digits[:-2],
        "hex with a prefix upper-case": prefix.upper() + digits if prefix else "0x" + digits,
    }


def _signature_cases(base: Case, name: str, variants: dict[str, str]) -> list[Case]:
    return [
        Case(label, _replace(base.headers, name, value), base.body)
        for label, value in variants.items()
    ]


def _common(base: Case, names: list[str], wrong: Case) -> list[Case]:
    cases = [base, wrong, Case("body changed", base.headers, base.body + b" ")]
    cases += [
        Case(f"without {name}", _replace(base.headers, name, None), base.body) for name in names
    ]
    cases += [Case(f"{name} empty", _replace(base.headers, name, ""), base.body) for name in names]
    return cases


BODY = orjson.dumps({"id": "evt_1", "type": "invoice.paid", "data": {"amount": 100}})


# ------------------------------------------------------------------------- Standard Webhooks/Svix


def standard_cases(now: int) -> list[Case]:
    hook = svix.Webhook(SVIX_SECRET)  # Svix's own signing helper
    ts = dt.datetime.fromtimestamp(now, dt.UTC)
    sig = hook.sign("msg_1", ts, BODY.decode())
    other = hook.sign("msg_1", ts, BODY.replace(b"100", b"200").decode())
    encoded = sig.partition(",")[2]
    good = [("webhook-id", "msg_1"), ("webhook-timestamp", str(now)), ("webhook-signature", sig)]
    svixed = [(n.replace("webhook-", "svix-"), v) for n, v in good]
    base = Case("genuine", good, BODY)
    wrong = Case("wrong secret", _replace(good, "webhook-signature", other), BODY)
    cases = _common(base, ["webhook-id", "webhook-timestamp", "webhook-signature"], wrong)
    cases += _signature_cases(
        base, "webhook-signature", {k: "v1," + v for k, v in _b64_variants(encoded).items()}
    )
    old = hook.sign("msg_1", ts - dt.timedelta(seconds=1000), BODY.decode())
    cases += [
        Case("svix names", svixed, BODY),
        Case("both names, agreeing", good + svixed, BODY),
        Case("svix-id, webhook-timestamp and webhook-signature", [svixed[0], *good[1:]], BODY),
        Case("both names, the ids differ", [("webhook-id", "msg_2"), *good[1:], *svixed], BODY),
        Case("both names, svix-id empty", [*good, ("svix-id", ""), *svixed[1:]], BODY),
        Case(
            "both names, svix-signature wrong",
            [*good, *svixed[:2], ("svix-signature", other)],
            BODY,
        ),
        Case("tab between entries", _replace(good, "webhook-signature", other + "\t" + sig), BODY),
        Case("comma between entries", _replace(good, "webhook-signature", other + "," + sig), BODY),
        Case(
            "two spaces between entries",
            _replace(good, "webhook-signature", other + "  " + sig),
            BODY,
        ),
        Case("entry duplicated", _replace(good, "webhook-signature", sig + " " + sig), BODY),
        Case("unknown version first", _replace(good, "webhook-signature", "v2,abc " + sig), BODY),
        Case("space after the comma", _replace(good, "webhook-signature", "v1, " + encoded), BODY),
        Case("version upper-case", _replace(good, "webhook-signature", "V1," + encoded), BODY),
        Case(
            "timestamp too old",
            _replace(
                _replace(good, "webhook-signature", old), "webhook-timestamp", str(now - 1000)
            ),
            BODY,
        ),
        Case(
            "timestamp with a leading zero",
            _replace(good, "webhook-timestamp", "0" + str(now)),
            BODY,
        ),
        Case("timestamp with a fraction", _replace(good, "webhook-timestamp", f"{now}.0"), BODY),
    ]
    return cases


# ---------------------------------------------------------------------------------- hex schemes


def stripe_cases(now: int) -> list[Case]:
    header = stripe.WebhookSignature.generate_signature_header(BODY.decode(), SECRET, now)
    digits = header.partition("v1=")[2]
    other = stripe.WebhookSignature.generate_signature_header(BODY.decode(), "other", now)
    odigits = other.partition("v1=")[2]
    base = Case("genuine", [("stripe-signature", header)], BODY)
    wrong = Case("wrong secret", [("stripe-signature", other)], BODY)
    cases = _common(base, ["stripe-signature"], wrong)
    cases += _signature_cases(
        base,
        "stripe-signature",
        {k: f"t={now},v1={v}" for k, v in _hex_variants("", digits).items()},
    )
    stale = stripe.WebhookSignature.generate_signature_header(BODY.decode(), SECRET, now - 1000)
    for label, value in {
        "rotation: two v1": f"t={now},v1={odigits},v1={digits}",
        "v1 duplicated": f"t={now},v1={digits},v1={digits}",
        "v0 and unknown elements": f"t={now},v0={odigits},x=y,v1={digits}",
        "elements in another order": f"v1={digits},t={now}",
        "semicolon between elements": f"t={now};v1={digits}",
        "space after the comma": f"t={now}, v1={digits}",
        "t twice": f"t={now},t={now},v1={digits}",
        "v1 upper-case key": f"t={now},V1={digits}",
        "timestamp too old": stale,
        "timestamp with a leading zero": f"t=0{now},v1={digits}",
        "timestamp with a plus sign": f"t=+{now},v1={digits}",
    }.items():
        cases.append(Case(label, [("stripe-signature", value)], BODY))
    return cases


def _mac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def github_cases(now: int) -> list[Case]:
    signature = official.octokit_sign(SECRET, BODY)
    good = [
        ("x-hub-signature-256", signature),
        ("x-github-event", "issues"),
        ("x-github-delivery", "d-1"),
    ]
    base = Case("genuine", good, BODY)
    wrong = Case(
        "wrong secret", _replace(good, "x-hub-signature-256", "sha256=" + _mac("x", BODY)), BODY
    )
    cases = _common(base, ["x-hub-signature-256"], wrong)
    cases += _signature_cases(base, "x-hub-signature-256", _hex_variants("sha256=", signature[7:]))
    return cases


def slack_cases(now: int) -> list[Case]:
    body = orjson.dumps(
        {"type": "event_callback", "event_id": "Ev1", "event": {"type": "app_mention"}}
    )
    signature = SignatureVerifier(SECRET).generate_signature(timestamp=str(now), body=body)
    assert signature is not None
    good = [("x-slack-signature", signature), ("x-slack-request-timestamp", str(now))]
    base = Case("genuine", good, body)
    other = SignatureVerifier("other").generate_signature(timestamp=str(now), body=body)
    wrong = Case("wrong secret", _replace(good, "x-slack-signature", other), body)
    cases = _common(base, ["x-slack-signature", "x-slack-request-timestamp"], wrong)
    cases += _signature_cases(base, "x-slack-signature", _hex_variants("v0=", signature[3:]))
    stale = SignatureVerifier(SECRET).generate_signature(timestamp=str(now - 1000), body=body)
    cases.append(
        Case(
            "timestamp too old",
            [("x-slack-signature", stale or ""), ("x-slack-request-timestamp", str(now - 1000))],
            body,
        )
    )
    return cases


def paddle_cases(now: int) -> list[Case]:
    body = orjson.dumps({"event_id": "evt_1", "event_type": "transaction.completed", "data": {}})
    digits = _mac(SECRET, f"{now}:".encode() + body)
    odigits = _mac("other", f"{now}:".encode() + body)
    base = Case("genuine", [("paddle-signature", f"ts={now};h1={digits}")], body)
    wrong = Case("wrong secret", [("paddle-signature", f"ts={now};h1={odigits}")], body)
    cases = _common(base, ["paddle-signature"], wrong)
    cases += _signature_cases(
        base,
        "paddle-signature",
        {k: f"ts={now};h1={v}" for k, v in _hex_variants("", digits).items()},
    )
    for label, value in {
        "rotation: two h1": f"ts={now};h1={odigits};h1={digits}",
        "h1 duplicated": f"ts={now};h1={digits};h1={digits}",
        "an unknown element": f"ts={now};h2={odigits};h1={digits}",
        "a space before h1": f"ts={now}; h1={digits}",
        "comma between elements": f"ts={now},h1={digits}",
        "an element without '='": f"ts={now};x;h1={digits}",
        "an element with two '='": f"ts={now};h1={odigits}=;h1={digits}",
        "elements in another order": f"h1={digits};ts={now}",
        "timestamp too old": f"ts={now - 1000};h1={_mac(SECRET, f'{now - 1000}:'.encode() + body)}",
    }.items():
        cases.append(Case(label, [("paddle-signature", value)], body))
    return cases


def zoom_cases(now: int) -> list[Case]:
    body = orjson.dumps({"event": "meeting.started", "event_ts": now * 1000, "payload": {}})
    digits = _mac(SECRET, f"v0:{now}:".encode() + body)
    good = [("x-zm-signature", "v0=" + digits), ("x-zm-request-timestamp", str(now))]
    base = Case("genuine", good, body)
    wrong = Case("wrong secret", _replace(good, "x-zm-signature", "v0=" + _mac("x", body)), body)
    cases = _common(base, ["x-zm-signature", "x-zm-request-timestamp"], wrong)
    cases += _signature_cases(base, "x-zm-signature", _hex_variants("v0=", digits))
    for label, stamp in {"timestamp too old": str(now - 1000), "milliseconds": f"{now}123"}.items():
        signed = "v0=" + _mac(SECRET, f"v0:{stamp}:".encode() + body)
        cases.append(
            Case(label, [("x-zm-signature", signed), ("x-zm-request-timestamp", stamp)], body)
        )
    return cases


def linear_cases(now: int) -> list[Case]:
    body = orjson.dumps(
        {"type": "Issue", "action": "create", "data": {"id": "i"}, "webhookTimestamp": now * 1000}
    )
    digits = _mac(SECRET, body)
    good = [("linear-signature", digits), ("linear-delivery", "d-1"), ("linear-event", "Issue")]
    base = Case("genuine", good, body)
    wrong = Case("wrong secret", _replace(good, "linear-signature", _mac("x", body)), body)
    cases = _common(base, ["linear-signature"], wrong)
    cases += _signature_cases(base, "linear-signature", _hex_variants("", digits))
    stale = body.replace(str(now * 1000).encode(), str((now - 100) * 1000).encode())
    cases.append(
        Case("timestamp too old", _replace(good, "linear-signature", _mac(SECRET, stale)), stale)
    )
    return cases


# ------------------------------------------------------------------------------- base64 schemes


def shopify_cases(now: int) -> list[Case]:
    signature = base64.b64encode(hmac.digest(SECRET.encode(), BODY, "sha256")).decode()
    good = [
        ("x-shopify-hmac-sha256", signature),
        ("x-shopify-topic", "orders/create"),
        ("x-shopify-shop-domain", "example.myshopify.com"),
        ("x-shopify-api-version", "2025-10"),
        ("x-shopify-webhook-id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
        ("x-shopify-triggered-at", "2026-12-08T00:00:00Z"),
        ("x-shopify-event-id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
    ]
    base = Case("genuine", good, BODY)
    other = base64.b64encode(hmac.digest(b"x", BODY, "sha256")).decode()
    wrong = Case("wrong secret", _replace(good, "x-shopify-hmac-sha256", other), BODY)
    names = [name for name, _ in good]
    cases = _common(base, names, wrong)
    cases += _signature_cases(base, "x-shopify-hmac-sha256", _b64_variants(signature))
    return cases


def twilio_cases(now: int) -> list[Case]:
    params = {"CallSid": "CA1", "CallStatus": "completed", "From": "+14158675309"}
    body = "&".join(f"{k}={v}" for k, v in params.items()).replace("+", "%2B").encode()
    signature = RequestValidator(SECRET).compute_signature(TWILIO_URL, params)
    good = [("x-twilio-signature", signature), ("i-twilio-idempotency-token", "t-1")]
    base = Case("genuine", good, body)
    other = RequestValidator("x").compute_signature(TWILIO_URL, params)
    wrong = Case("wrong secret", _replace(good, "x-twilio-signature", other), body)
    cases = _common(base, ["x-twilio-signature"], wrong)
    cases += _signature_cases(base, "x-twilio-signature", _b64_variants(signature))
    ported = RequestValidator(SECRET).compute_signature(
        TWILIO_URL.replace(".com/", ".com:443/"), params
    )
    cases.append(Case("signed with the port", _replace(good, "x-twilio-signature", ported), body))
    return cases
