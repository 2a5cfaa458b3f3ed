"""The kit's sender signs as the providers' own libraries check: standardwebhooks (v1), svix
(Svix's default header names), stripe's
WebhookSignature, slack_sdk's SignatureVerifier, and GitHub's and Shopify's documented HMACs
recomputed by hand. The receiver's verifiers are not the judge here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse

import orjson
import pytest
import standardwebhooks
import stripe
import svix
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk.signature import SignatureVerifier

from receiver import ReceiverError
from receiver.testing import FakeClock, Sender
from tests.testing.app import GITHUB, SHOPIFY, SLACK, STANDARD, STRIPE

URL = "http://127.0.0.1:9"  # never contacted: only headers are made
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
DATA = st.dictionaries(st.text(max_size=8), INT64 | st.text(max_size=8), max_size=4)


@settings(max_examples=25, deadline=None)
@given(data=DATA)
async def test_reference_libraries_accept_the_kits_signatures(data: dict[str, object]) -> None:
    clock = FakeClock(time.time())  # standardwebhooks checks the timestamp against real time
    for provider, secret, scheme in [
        ("acme", STANDARD, "standard-webhooks"),
        ("acme", STANDARD, "svix"),
        ("stripe", STRIPE, "stripe"),
        ("github", GITHUB, "github"),
        ("shopify", SHOPIFY, "shopify"),
        ("slack", SLACK, "slack"),
    ]:
        async with Sender(URL, provider, secret, scheme=scheme, clock=clock) as sender:
            webhook = sender.event("thing.happened", data)
            headers = dict(sender.headers(webhook))
        body = webhook.body
        if scheme == "standard-webhooks":
            verified = standardwebhooks.Webhook(STANDARD).verify(body, headers)
            assert verified["type"] == "thing.happened"
        elif scheme == "svix":
            assert "webhook-id" not in headers
            assert headers["svix-id"] == webhook.id
            svix.Webhook(STANDARD).verify(body, headers)
        elif scheme == "stripe":
            assert stripe.WebhookSignature.verify_header(
                body.decode(), headers["stripe-signature"], STRIPE, tolerance=None
            )
            assert orjson.loads(body)["id"] == webhook.id
        elif scheme == "github":
            expected = hmac.new(GITHUB.encode(), body, hashlib.sha256).hexdigest()
            assert headers["x-hub-signature-256"] == "sha256=" + expected
            assert headers["x-github-event"] == "thing"
            assert orjson.loads(body)["action"] == "happened"
        elif scheme == "shopify":
            digest = hmac.new(SHOPIFY.encode(), body, hashlib.sha256).digest()
            assert headers["x-shopify-hmac-sha256"] == base64.b64encode(digest).decode()
            assert headers["x-shopify-topic"] == "thing.happened"
        else:
            sdk = SignatureVerifier(SLACK)
            assert (
                sdk.generate_signature(timestamp=headers["x-slack-request-timestamp"], body=body)
                == headers["x-slack-signature"]
            )
            assert orjson.loads(body)["event_id"] == webhook.id


async def test_a_url_needs_a_scheme_and_a_receiver_needs_the_provider() -> None:
    with pytest.raises(ReceiverError, match="scheme="):
        Sender(URL, "stripe", STRIPE)
    with pytest.raises(ReceiverError, match="unknown scheme"):
        Sender(URL, "stripe", STRIPE, scheme="paypal")


async def test_data_that_is_not_json_is_refused_clearly() -> None:
    async with Sender(URL, "acme", STANDARD, scheme="standard-webhooks") as sender:
        with pytest.raises(ReceiverError, match="must encode as JSON"):
            sender.event("thing.happened", {"n": 2**64})


def test_the_fake_clock_only_moves_forward() -> None:
    clock = FakeClock(10)
    assert clock.advance(5) == 15 == clock()
    with pytest.raises(ReceiverError, match="only moves forward"):
        clock.advance(-1)
    with pytest.raises(ReceiverError, match="only moves forward"):
        clock.advance(True)  # type: ignore[arg-type]


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -1.0, True, "10"])
def test_the_fake_clock_starts_at_a_real_time(now: float) -> None:
    # NaN compares false with everything: no lease or receipt would ever expire.
    with pytest.raises(ReceiverError, match="fake clock starts at finite unix seconds"):
        FakeClock(now)


@settings(max_examples=15, deadline=None)
@given(data=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4))
async def test_the_kits_new_senders_sign_by_the_documented_formulas(
    data: dict[str, str],
) -> None:
    """Paddle, Zoom, Linear and Twilio, recomputed with hmac from their documentation (none of
    them publishes a Python reference library the kit could be checked against)."""
    clock = FakeClock(time.time())
    ts = str(int(clock()))
    for scheme, secret in [
        ("paddle", "pdl_secret"),
        ("zoom", "zoom_secret"),
        ("linear", "linear_secret"),
        ("twilio", "auth_token"),
    ]:
        async with Sender(URL, scheme, secret, scheme=scheme, clock=clock) as sender:
            webhook = sender.event("message.delivered", data)
            body, pairs = sender.attempt(webhook)
        headers = dict(pairs)
        key = secret.encode()
        if scheme == "paddle":
            digest = hmac.new(key, ts.encode() + b":" + body, hashlib.sha256).hexdigest()
            assert headers["paddle-signature"] == f"ts={ts};h1={digest}"
            assert orjson.loads(body)["event_id"] == webhook.id
        elif scheme == "zoom":
            digest = hmac.new(key, f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
            assert headers["x-zm-signature"] == "v0=" + digest
        elif scheme == "linear":
            assert headers["linear-signature"] == hmac.new(key, body, hashlib.sha256).hexdigest()
            assert orjson.loads(body)["webhookTimestamp"] == int(ts) * 1000
        else:
            params = sorted(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
            signed = f"{URL}/twilio" + "".join(k + v for k, v in params)
            sha1 = hmac.new(key, signed.encode(), hashlib.sha1).digest()
            assert headers["x-twilio-signature"] == base64.b64encode(sha1).decode()
            assert headers["content-type"] == "application/x-www-form-urlencoded"
