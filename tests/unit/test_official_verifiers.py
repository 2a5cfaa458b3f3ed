"""The receiver against the senders' own verifiers, on the same bytes (tests/official.py, the
cases in tests/official_corpus.py).

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

import time
from collections.abc import Callable

import pytest
from starlette.datastructures import Headers

from receiver import GitHub, Linear, Paddle, Shopify, Slack, StandardWebhooks, Stripe, Twilio, Zoom
from receiver._exceptions import MalformedRequest, VerificationError
from receiver._verification.verifier import Verifier
from receiver.testing import Sender
from tests import official
from tests.official_corpus import (
    SECRET,
    SVIX_SECRET,
    TWILIO_URL,
    Case,
    Pairs,
    github_cases,
    linear_cases,
    paddle_cases,
    shopify_cases,
    slack_cases,
    standard_cases,
    stripe_cases,
    twilio_cases,
    zoom_cases,
)


def verdict(verifier: Verifier, case: Case, now: float) -> bool:
    raw = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in case.headers]
    try:
        verifier.verify(Headers(raw=raw), case.body, now)
    except VerificationError:  # MalformedRequest (400) is one too: a 4xx, never a 500
        return False
    return True


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
