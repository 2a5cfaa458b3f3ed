"""Twilio, Paddle Billing, Zoom and Linear verifiers: published vectors where the sender has
them, an independent recomputation (the standard library's hmac) where it has none, rotation,
tolerance, malformed headers, and totality under arbitrary input.

Vectors:
- Twilio: twilio-python's tests (tests/unit/test_request_validator.py: the form example, its
  repeated-parameter example, the ":443" port variant and the JSON body with bodySHA256).
- Paddle, Zoom, Linear publish a header format and an algorithm but no secret with a body and
  its signature: their signatures are recomputed here with hmac from the documented formulas
  (developer.paddle.com/webhooks/signature-verification, developers.zoom.us/docs/api/webhooks,
  linear.app/developers/webhooks), and Paddle's documented header example is parsed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from receiver._exceptions import ConfigurationError, MalformedRequest, VerificationError
from receiver._verification.senders import (
    Linear,
    Paddle,
    Zoom,
    sign_linear,
    sign_paddle,
    sign_zoom,
)
from receiver._verification.twilio import Twilio, sign_twilio, twilio_json_url, twilio_key
from receiver._verification.verifier import VerifiedDelivery, Verifier

NOW = 1_800_000_000

# twilio-python, tests/unit/test_request_validator.py
TWILIO_TOKEN = "12345"
TWILIO_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TWILIO_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Digits": "1234",
    "From": "+14158675309",
    "To": "+18005551212",
    "Caller": "+14158675309",
}
TWILIO_SIGNATURE = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
TWILIO_DUPLICATES = [
    ("Sid", "CA123"),
    ("SidAccount", "AC123"),
    ("Digits", "5678"),
    ("Digits", "1234"),
]
TWILIO_DUPLICATES_SIGNATURE = "IK+Dwps556ElfBT0I3Rgjkr1wJU="
TWILIO_PORT_443_SIGNATURE = "kvajT1Ptam85bY51eRf/AJRuM3w="
TWILIO_JSON_BODY = b'{"property": "value", "boolean": true}'
TWILIO_JSON_SIGNATURE = "a9nBmqA0ju/hNViExpshrM61xv4="


def headers(*pairs: tuple[str, str]) -> Headers:
    return Headers(raw=[(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs])


def form(pairs: list[tuple[str, str]]) -> bytes:
    import urllib.parse

    return urllib.parse.urlencode(pairs).encode("ascii")


def refused(error: type[VerificationError], check: str, call: object) -> None:
    with pytest.raises(VerificationError) as caught:
        call()  # type: ignore[operator]
    assert type(caught.value) is error, caught.value
    assert caught.value.check == check, caught.value


# -------------------------------------------------------------------------------------- Twilio


def test_twilio_sdk_vectors() -> None:
    assert sign_twilio(TWILIO_TOKEN, TWILIO_URL, TWILIO_PARAMS.items()) == TWILIO_SIGNATURE
    assert sign_twilio(TWILIO_TOKEN, TWILIO_URL, TWILIO_DUPLICATES) == TWILIO_DUPLICATES_SIGNATURE
    assert (
        sign_twilio(TWILIO_TOKEN, TWILIO_URL.replace(".com", ".com:443"), TWILIO_PARAMS.items())
        == TWILIO_PORT_443_SIGNATURE
    )
    assert sign_twilio(TWILIO_TOKEN, TWILIO_URL, body=TWILIO_JSON_BODY) == TWILIO_JSON_SIGNATURE
    assert twilio_json_url(TWILIO_URL, TWILIO_JSON_BODY).endswith(
        "&bodySHA256=0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620"
    )


def test_twilio_verifies_the_sdk_vectors_including_ports_and_json() -> None:
    verifier = Twilio(["an-old-token", TWILIO_TOKEN], url=TWILIO_URL)
    body = form(list(TWILIO_PARAMS.items()))
    got = verifier.verify(
        headers(("x-twilio-signature", TWILIO_SIGNATURE), ("i-twilio-idempotency-token", "t-1")),
        body,
        NOW,
    )
    signed = "".join(name + value for name, value in sorted(TWILIO_PARAMS.items()))
    key = "sha256:" + hashlib.sha256(b"form\x00" + signed.encode()).hexdigest()
    # The token is the key; what Twilio signs is the key of a request without one.
    assert got == VerifiedDelivery("t-1", None, "twilio")
    assert verifier.legacy_key(body) == key
    # Twilio signed with the default port; the configured URL has none. No token.
    ported = headers(("x-twilio-signature", TWILIO_PORT_443_SIGNATURE))
    assert verifier.verify(ported, body, NOW) == VerifiedDelivery(key, None, "twilio")
    repeated = form(TWILIO_DUPLICATES)
    got = verifier.verify(
        headers(
            ("x-twilio-signature", TWILIO_DUPLICATES_SIGNATURE),
            ("i-twilio-idempotency-token", "t-2"),
        ),
        repeated,
        NOW,
    )
    assert got.webhook_id == "t-2"
    assert verifier.legacy_key(repeated) == twilio_key(repeated, is_json=False) != key
    json_headers = headers(
        ("x-twilio-signature", TWILIO_JSON_SIGNATURE),
        ("i-twilio-idempotency-token", "t-3"),
        ("content-type", "application/json"),
    )
    json_key = "sha256:" + hashlib.sha256(b"json\x00" + TWILIO_JSON_BODY).hexdigest()
    assert verifier.verify(json_headers, TWILIO_JSON_BODY, NOW) == VerifiedDelivery(
        "t-3", None, None
    )
    assert verifier.legacy_key(TWILIO_JSON_BODY) == json_key
    assert verifier.key_of(TWILIO_JSON_BODY, "t-3") == "t-3"
    assert verifier.key_of(body, "t-1") == "t-1"
    refused(VerificationError, "signature", lambda: verifier.verify(json_headers, b"{}", NOW))


def test_twilio_keys_on_its_idempotency_token() -> None:
    """Twilio keeps I-Twilio-Idempotency-Token on its retries and signs no id: the token is the
    key, so two genuine requests with the same parameters (the same digits gathered twice in
    one call) stay two events. Without a token (or with one that is no id), the key is made
    from what Twilio signs; distinct requests (another sid or status) get distinct keys."""
    url = "https://example.com/webhooks/twilio"
    verifier = Twilio(["token"], url=url)
    params = [("MessageSid", "SM1"), ("MessageStatus", "delivered"), ("AccountSid", "AC1")]
    sig = ("x-twilio-signature", sign_twilio("token", url, params))
    got = [
        verifier.verify(headers(sig, ("i-twilio-idempotency-token", t)), form(params), NOW)
        for t in ("idem-1", "idem-2", "not an id")
    ]
    content = twilio_key(form(params), is_json=False)
    assert [g.webhook_id for g in got] == ["idem-1", "idem-2", content]
    assert got[0].event_type == "message.delivered"
    # The parameters' order on the wire is not signed: the same request, the same key.
    reordered = form(list(reversed(params)))
    assert verifier.verify(headers(sig), reordered, NOW).webhook_id == content
    keys = {content}
    for other in (
        [("MessageSid", "SM2"), ("MessageStatus", "delivered"), ("AccountSid", "AC1")],
        [("MessageSid", "SM1"), ("MessageStatus", "read"), ("AccountSid", "AC1")],
    ):
        signed = headers(("x-twilio-signature", sign_twilio("token", url, other)))
        keys.add(verifier.verify(signed, form(other), NOW).webhook_id)
    assert len(keys) == 3


def test_twilio_types_from_the_parameters() -> None:
    url = "https://example.com/webhooks/twilio"
    verifier = Twilio(["token"], url=url)
    params = [("MessageSid", "SM1"), ("MessageStatus", "delivered"), ("AccountSid", "AC1")]
    sig = sign_twilio("token", url, params)
    got = verifier.verify(headers(("x-twilio-signature", sig)), form(params), NOW)
    assert got.event_type == "message.delivered"
    call = [("CallSid", "CA9"), ("CallStatus", "completed")]
    got = verifier.verify(
        headers(("x-twilio-signature", sign_twilio("token", url, call))), form(call), NOW
    )
    assert got.event_type == "call.completed"
    fixed = Twilio(["token"], url=url, event_type="sms.incoming")
    assert fixed.verify(headers(("x-twilio-signature", sig)), form(params), NOW).event_type == (
        "sms.incoming"
    )


@pytest.mark.parametrize(
    ("pairs", "body", "error", "check"),
    [
        ([], b"a=b", MalformedRequest, "missing_header:x-twilio-signature"),
        ([("x-twilio-signature", "not base64")], b"a=b", MalformedRequest, "signature"),
        ([("x-twilio-signature", "A" * 27 + "=")], b"a=b", VerificationError, "signature"),
        ([("x-twilio-signature", "A" * 27 + "=")], b"\xff=\xfe", MalformedRequest, "body"),
        ([("x-twilio-signature", "A" * 27 + "=")], b"not a form", MalformedRequest, "body"),
    ],
)
def test_twilio_refusals(
    pairs: list[tuple[str, str]], body: bytes, error: type[VerificationError], check: str
) -> None:
    verifier = Twilio(["token"], url="https://example.com/t")
    refused(error, check, lambda: verifier.verify(headers(*pairs), body, NOW))


def test_twilio_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="url must be"):
        Twilio(["t"], url="example.com/no-scheme")
    with pytest.raises(ConfigurationError, match="must be a list"):
        Twilio("t", url="https://example.com")
    # Signed as UTF-8: a lone surrogate failed every delivery with a 500.
    with pytest.raises(ConfigurationError, match="lone surrogate"):
        Twilio(["s3cr3t\ud800"], url="https://example.com")
    with pytest.raises(ConfigurationError, match="url must be"):
        Twilio(["t"], url="https://example.com/\ud800")
    assert "s3cr3t" not in repr(Twilio(["s3cr3t"], url="https://example.com"))


# -------------------------------------------------------------------------------------- Paddle

PADDLE_SECRET = "pdl_ntfset_01gkpjp8bkh3ynv3pkrb6ctqvt_hm5mmIa5Bp0nPdtlkFQnS6e0V7nNzUq/"
PADDLE_BODY = orjson.dumps(
    {"event_id": "evt_01h", "event_type": "transaction.completed", "data": {"id": "txn_1"}}
)


def test_paddle_signature_is_the_documented_hmac() -> None:
    expected = hmac.new(PADDLE_SECRET.encode(), b"1671552777:" + PADDLE_BODY, "sha256").hexdigest()
    assert sign_paddle(PADDLE_SECRET, 1671552777, PADDLE_BODY) == f"ts=1671552777;h1={expected}"


def test_paddle_verifies_rotation_and_the_window() -> None:
    verifier = Paddle(["old-secret", PADDLE_SECRET])
    value = sign_paddle(PADDLE_SECRET, NOW, PADDLE_BODY)
    rotated = value + ";h1=" + sign_paddle("old-secret", NOW, PADDLE_BODY).split("h1=")[1]
    for header in (value, rotated, "h1=" + "0" * 64 + ";" + value):
        got = verifier.verify(headers(("paddle-signature", header)), PADDLE_BODY, NOW)
        assert got == VerifiedDelivery("evt_01h", NOW, "transaction.completed")
    late = headers(("paddle-signature", value))
    refused(VerificationError, "timestamp", lambda: verifier.verify(late, PADDLE_BODY, NOW + 301))
    refused(VerificationError, "signature", lambda: verifier.verify(late, PADDLE_BODY + b" ", NOW))


@pytest.mark.parametrize(
    ("value", "error", "check"),
    [
        # The documented example's shape, under another secret: parsed, then refused.
        (
            "ts=1800000000;h1=eb4d0dc8853be92b7f063b9f3ba5233eb920a09459b6e6b2c26705b4364db151",
            VerificationError,
            "signature",
        ),
        ("h1=" + "a" * 64, MalformedRequest, "timestamp"),
        ("ts=1800000000", MalformedRequest, "signature"),
        ("ts=01800000000;h1=" + "a" * 64, MalformedRequest, "timestamp"),
        ("ts=1;ts=2;h1=" + "a" * 64, MalformedRequest, "timestamp"),
    ],
)
def test_paddle_refusals(value: str, error: type[VerificationError], check: str) -> None:
    verifier = Paddle([PADDLE_SECRET])
    refused(
        error,
        check,
        lambda: verifier.verify(headers(("paddle-signature", value)), PADDLE_BODY, NOW),
    )


def test_paddle_body_without_an_event_id_is_malformed_after_the_signature() -> None:
    body = b'{"event_type": "x.y"}'
    value = sign_paddle(PADDLE_SECRET, NOW, body)
    verifier = Paddle([PADDLE_SECRET])
    refused(
        MalformedRequest,
        "event_id",
        lambda: verifier.verify(headers(("paddle-signature", value)), body, NOW),
    )


# ---------------------------------------------------------------------------------------- Zoom

ZOOM_SECRET = "zoom-secret-token"
ZOOM_BODY = orjson.dumps(
    {"event": "meeting.started", "event_ts": 1626230691572, "payload": {"object": {"id": "1"}}}
)


def test_zoom_signature_id_and_url_validation() -> None:
    expected = hmac.new(ZOOM_SECRET.encode(), f"v0:{NOW}:".encode() + ZOOM_BODY, "sha256")
    assert sign_zoom(ZOOM_SECRET, NOW, ZOOM_BODY) == "v0=" + expected.hexdigest()
    verifier = Zoom(["old", ZOOM_SECRET])
    signed = headers(
        ("x-zm-signature", sign_zoom(ZOOM_SECRET, NOW, ZOOM_BODY)),
        ("x-zm-request-timestamp", str(NOW)),
    )
    got = verifier.verify(signed, ZOOM_BODY, NOW)
    digest = hashlib.sha256(ZOOM_BODY).hexdigest()[:32]
    assert got == VerifiedDelivery(
        f"meeting.started:1626230691572:{digest}", NOW, "meeting.started"
    )
    refused(VerificationError, "timestamp", lambda: verifier.verify(signed, ZOOM_BODY, NOW - 301))
    challenge = {
        "payload": {"plainToken": "qgg8vlvZRS6UYooatFL8Aw"},
        "event": "endpoint.url_validation",
    }
    answer = Zoom([ZOOM_SECRET, "old"]).url_validation(challenge)
    token = hmac.new(ZOOM_SECRET.encode(), b"qgg8vlvZRS6UYooatFL8Aw", "sha256").hexdigest()
    assert answer == {"plainToken": "qgg8vlvZRS6UYooatFL8Aw", "encryptedToken": token}


def test_zoom_accepts_a_millisecond_timestamp_and_refuses_malformed_ones() -> None:
    verifier = Zoom([ZOOM_SECRET])
    millis = str(NOW * 1000)
    signed = headers(
        (
            "x-zm-signature",
            "v0="
            + hmac.new(
                ZOOM_SECRET.encode(), f"v0:{millis}:".encode() + ZOOM_BODY, "sha256"
            ).hexdigest(),
        ),
        ("x-zm-request-timestamp", millis),
    )
    assert verifier.verify(signed, ZOOM_BODY, NOW).timestamp == NOW
    for stamp in ("-1", "1e9", "123456789012"):
        bad = headers(("x-zm-signature", "v0=" + "a" * 64), ("x-zm-request-timestamp", stamp))
        with pytest.raises(MalformedRequest, match="unix seconds"):
            verifier.verify(bad, ZOOM_BODY, NOW)


# -------------------------------------------------------------------------------------- Linear

LINEAR_SECRET = "lin_wh_secret"


def linear_body(millis: int) -> bytes:
    return orjson.dumps(
        {"action": "create", "type": "Issue", "data": {"id": "i1"}, "webhookTimestamp": millis}
    )


def test_linear_signature_type_and_one_minute_window() -> None:
    body = linear_body(NOW * 1000)
    assert (
        sign_linear(LINEAR_SECRET, body)
        == hmac.new(LINEAR_SECRET.encode(), body, "sha256").hexdigest()
    )
    verifier = Linear(["old", LINEAR_SECRET])
    signed = headers(
        ("linear-signature", sign_linear(LINEAR_SECRET, body)), ("linear-delivery", "d-1")
    )
    key = verifier.key_of(body, "")
    assert key.startswith("sha256:")
    assert verifier.verify(signed, body, NOW + 59) == VerifiedDelivery(
        key, NOW, "Issue.create", "d-1"
    )
    # A capture re-sent under a new Linear-Delivery lands on its key; so does Linear's own retry,
    # which refreshes webhookTimestamp inside the signed body.
    resent = headers(
        ("linear-signature", sign_linear(LINEAR_SECRET, body)), ("linear-delivery", "x")
    )
    assert verifier.verify(resent, body, NOW).webhook_id == key
    retry = linear_body((NOW + 3600) * 1000)
    retried = headers(("linear-signature", sign_linear(LINEAR_SECRET, retry)))
    assert verifier.verify(retried, retry, NOW + 3600).webhook_id == key
    other = body.replace(b"Issue", b"Comment")
    assert verifier.key_of(other, "") != key
    refused(VerificationError, "timestamp", lambda: verifier.verify(signed, body, NOW + 61))
    refused(VerificationError, "timestamp", lambda: verifier.verify(signed, body, NOW - 61))
    refused(
        VerificationError,
        "signature",
        lambda: verifier.verify(signed, linear_body(NOW * 1000 + 1), NOW),
    )
    stampless = b'{"type": "Issue"}'
    unstamped = headers(
        ("linear-signature", sign_linear(LINEAR_SECRET, stampless)), ("linear-delivery", "d")
    )
    refused(MalformedRequest, "timestamp", lambda: verifier.verify(unstamped, stampless, NOW))


# ---------------------------------------------------------------------------------- totality

VERIFIERS: list[Verifier] = [
    Paddle([PADDLE_SECRET]),
    Zoom([ZOOM_SECRET]),
    Linear([LINEAR_SECRET]),
    Twilio([TWILIO_TOKEN], url=TWILIO_URL),
]
NAMES = [
    "paddle-signature",
    "x-zm-signature",
    "x-zm-request-timestamp",
    "linear-signature",
    "linear-delivery",
    "x-twilio-signature",
    "i-twilio-idempotency-token",
    "content-type",
]
VALUES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=80),
    st.sampled_from(
        ["ts=1800000000;h1=" + "a" * 64, "v0=" + "b" * 64, str(NOW), "application/json"]
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=6),
    body=st.binary(max_size=200) | st.sampled_from([PADDLE_BODY, ZOOM_BODY, b"a=b&c=d"]),
)
def test_any_input_verifies_or_raises_our_error(pairs: list[tuple[str, str]], body: bytes) -> None:
    for verifier in VERIFIERS:
        with contextlib.suppress(VerificationError):  # anything else fails the test
            verifier.verify(headers(*pairs), body, NOW)


def test_reprs_hold_no_secret() -> None:
    for verifier in VERIFIERS:
        text = repr(verifier)
        for secret in (PADDLE_SECRET, ZOOM_SECRET, LINEAR_SECRET):
            assert secret not in text
