"""The receiver against the senders' own verifiers, on the same bytes (tests/official.py).

For each scheme, a genuine delivery and its mutations (the case of hex digits, base64 padding,
alphabet and final bits, whitespace, separators, unknown and duplicated elements, missing
headers, timestamps, the id headers Svix names its own way) get one verdict from the receiver's
verifier and one from the sender's library, and the two must agree: the receiver accepts what
the sender's library accepts and refuses what it refuses. Where they differ on purpose, the case
is listed in STRICTER with the reason, and the test checks that difference instead (the receiver
refuses, the library accepts); no difference goes the other way.

Not in the corpus: whitespace around a whole header value (HTTP strips it before any verifier
sees the value: h11 under the receiver, fetch's Headers under the Node libraries), and a header
sent twice (the libraries are handed one value per name by their framework; the receiver
refuses a second one, tests/unit/test_schemes.py).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import pytest
import stripe
import svix
from slack_sdk.signature import SignatureVerifier
from starlette.datastructures import Headers
from twilio.request_validator import RequestValidator

from receiver import GitHub, Linear, Paddle, Shopify, Slack, StandardWebhooks, Stripe, Twilio, Zoom
from receiver._exceptions import MalformedRequest, VerificationError
from receiver._verification.verifier import Verifier
from receiver.testing import Sender
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


def verdict(verifier: Verifier, case: Case, now: float) -> bool:
    raw = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in case.headers]
    try:
        verifier.verify(Headers(raw=raw), case.body, now)
    except VerificationError:  # MalformedRequest (400) is one too: a 4xx, never a 500
        return False
    return True


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


# ----------------------------------------------------------------------------------- the test


Reference = Callable[[list[Case], int], list[bool]]


def _each(accepts: Callable[[str, Pairs, bytes, float], bool], secret: str) -> Reference:
    return lambda cases, now: [accepts(secret, c.headers, c.body, now) for c in cases]


def _node(scheme: str) -> Reference:
    return lambda cases, now: official.node_accepts(
        scheme, SECRET, [(c.headers, c.body) for c in cases], now
    )


def _standard_webhooks(cases: list[Case], now: int) -> list[bool]:
    return [official.standard_webhooks_accepts(SVIX_SECRET, c.headers, c.body, now) for c in cases]


def _webhook_names_only(now: int) -> list[Case]:
    """The Standard Webhooks cases without Svix's names, which the spec's library never reads."""
    return [c for c in standard_cases(now) if not any(n.startswith("svix-") for n, _ in c.headers)]


SCHEMES: dict[str, tuple[Callable[[int], list[Case]], Verifier, Reference]] = {
    "standard-webhooks": (_webhook_names_only, StandardWebhooks([SVIX_SECRET]), _standard_webhooks),
    "svix": (
        standard_cases,
        StandardWebhooks([SVIX_SECRET]),
        _each(official.svix_accepts, SVIX_SECRET),
    ),
    "stripe": (stripe_cases, Stripe([SECRET]), _each(official.stripe_accepts, SECRET)),
    "github": (github_cases, GitHub([SECRET]), _node("github")),
    "shopify": (shopify_cases, Shopify([SECRET]), _node("shopify")),
    "slack": (slack_cases, Slack([SECRET]), _each(official.slack_accepts, SECRET)),
    "paddle": (paddle_cases, Paddle([SECRET]), _each(official.paddle_accepts, SECRET)),
    "zoom": (zoom_cases, Zoom([SECRET]), _each(official.zoom_accepts, SECRET)),
    "linear": (linear_cases, Linear([SECRET]), _node("linear")),
    "twilio": (
        twilio_cases,
        Twilio([SECRET], url=TWILIO_URL),
        lambda cases, now: [
            official.twilio_accepts(SECRET, TWILIO_URL, c.headers, c.body) for c in cases
        ],
    ),
}

#: Where the receiver refuses what the sender's own library accepts, on purpose. Never the other
#: way round: a spelling, header or element the library refuses, the receiver refuses too.
STRICTER: dict[tuple[str, str], str] = {
    # The libraries parse the timestamp as a number and sign the number re-formatted, so
    # "0<t>", "+<t>" and "<t>.0" verify under the signature of "<t>": one signature, several
    # header texts, none of which the sender sends. The receiver verifies the text as sent
    # (canonical decimal only), so a replayer cannot vary it. Not copied.
    ("svix", "timestamp with a leading zero"): "the signed text is the text as sent",
    ("svix", "timestamp with a fraction"): "the signed text is the text as sent",
    ("standard-webhooks", "timestamp with a leading zero"): "the signed text is the text as sent",
    ("standard-webhooks", "timestamp with a fraction"): "the signed text is the text as sent",
    ("stripe", "timestamp with a leading zero"): "the signed text is the text as sent",
    ("stripe", "timestamp with a plus sign"): "the signed text is the text as sent",
    # Stripe's SDK takes the first t= and ignores the second; which of two timestamps was
    # signed is left to the reader, so the receiver refuses the header (400 timestamp).
    ("stripe", "t twice"): "two timestamps in one header",
    # Svix's libraries take svix-id and ignore a different webhook-id: anything else in front of
    # the receiver reading webhook-id would see another id than the one verified (400
    # duplicate_header:webhook-id). Svix never sends the two with different values.
    ("svix", "both names, the ids differ"): "two ids for one delivery",
    # Zoom's documented check compares the signature only; the receiver also refuses a
    # timestamp past its tolerance, as for every sender that signs one.
    ("zoom", "timestamp too old"): "the signed timestamp is checked",
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_the_receiver_agrees_with_the_senders_library(scheme: str) -> None:
    build, verifier, reference = SCHEMES[scheme]
    now = int(time.time())
    cases = build(now)
    theirs = reference(cases, now)
    assert theirs[0], "the sender's library refuses the genuine delivery"
    ours = [verdict(verifier, case, now) for case in cases]
    differ = []
    for case, mine, their in zip(cases, ours, theirs, strict=True):
        reason = STRICTER.get((scheme, case.name))
        expected = False if reason is not None and their else their
        if mine != expected or (reason is not None and not their):
            differ.append(f"{case.name}: receiver {mine}, library {their}, stricter: {reason}")
    assert not differ, "\n".join(differ)


KIT = {  # scheme -> (provider, secret): the receiver's own signing code, through the kit
    "standard-webhooks": ("acme", SVIX_SECRET),
    "svix": ("acme", SVIX_SECRET),
    "stripe": ("stripe", SECRET),
    "github": ("github", SECRET),
    "shopify": ("shopify", SECRET),
    "slack": ("slack", SECRET),
    "paddle": ("paddle", SECRET),
    "zoom": ("zoom", SECRET),
    "linear": ("linear", SECRET),
    "twilio": ("twilio", SECRET),
}


@pytest.mark.parametrize("scheme", sorted(KIT))
async def test_the_receivers_own_signatures_pass_the_senders_library(scheme: str) -> None:
    """receiver.testing.Sender (sign, sign_stripe, ...) sends what the sender's library accepts,
    headers included: the receiver's signing code is not judged by its own verifiers alone."""
    provider, secret = KIT[scheme]
    now = int(time.time())
    url = TWILIO_URL.removesuffix("/twilio")
    async with Sender(url, provider, secret, scheme=scheme, clock=lambda: now) as sender:
        webhook = sender.event("issue.create" if scheme == "linear" else "thing.happened", {})
        body, headers = sender.attempt(webhook)
    case = Case("the kit's", headers, body)
    _, verifier, reference = SCHEMES[scheme]
    assert reference([case], now) == [True]
    assert verdict(verifier, case, now)


#: (scheme, case) -> the refusal: a spelling the sender's library refuses is a wrong signature
#: (401 signature); a header it requires is missing (400); two values for one field (400).
REFUSALS = {
    **{
        (scheme, case): (401, "signature")
        for scheme in ("stripe", "github", "slack", "paddle", "zoom", "linear")
        for case in ("hex upper-case", "hex with one upper-case digit")
    },
    ("shopify", "base64 with non-zero final bits"): (401, "signature"),
    ("twilio", "base64 with non-zero final bits"): (401, "signature"),
    ("svix", "base64 with non-zero final bits"): (401, "signature"),
    ("svix", "tab between entries"): (401, "signature"),
    ("paddle", "an unknown element"): (401, "signature"),
    ("paddle", "a space before h1"): (401, "signature"),
    ("paddle", "an element with two '='"): (401, "signature"),
    ("shopify", "without x-shopify-shop-domain"): (400, "missing_header:x-shopify-shop-domain"),
    ("shopify", "without x-shopify-api-version"): (400, "missing_header:x-shopify-api-version"),
    ("shopify", "without x-shopify-webhook-id"): (400, "missing_header:x-shopify-webhook-id"),
    ("svix", "both names, the ids differ"): (400, "duplicate_header:webhook-id"),
    ("svix", "both names, svix-id empty"): (400, "duplicate_header:webhook-id"),
    ("svix", "both names, svix-signature wrong"): (400, "duplicate_header:webhook-signature"),
}


@pytest.mark.parametrize(("scheme", "name"), sorted(REFUSALS))
def test_a_refused_spelling_names_its_check(scheme: str, name: str) -> None:
    build, verifier, _ = SCHEMES[scheme]
    now = int(time.time())
    (case,) = [c for c in build(now) if c.name == name]
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in case.headers]
    with pytest.raises(VerificationError) as refused:
        verifier.verify(Headers(raw=raw), case.body, now)
    status = 400 if isinstance(refused.value, MalformedRequest) else 401
    assert (status, refused.value.check) == REFUSALS[scheme, name]
