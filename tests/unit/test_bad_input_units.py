"""T6 at the verifier, without a store: verification is total (any header list, body and clock
give a VerifiedDelivery or a VerificationError, never another exception), and it agrees with the
`standardwebhooks` reference on what the reference signs and accepts, including the inputs on
which the reference itself crashes with raw ValueError/UnicodeDecodeError."""

from __future__ import annotations

import base64
import datetime as dt
import time
from typing import TypeVar

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from starlette.datastructures import Headers

from receiver import (
    MalformedRequest,
    StandardWebhooks,
    VerificationError,
    VerifiedDelivery,
    generate_keypair,
    sign,
)
from tests.support import SECRET, T0

T = TypeVar("T")
PRIVATE_KEY, PUBLIC_KEY = generate_keypair()
VERIFIER = StandardWebhooks([SECRET, PUBLIC_KEY])
NOW = int(T0)
SECRET_TEXT = SECRET.removeprefix("whsec_")

NAMES = st.one_of(
    st.sampled_from([b"webhook-id", b"webhook-timestamp", b"webhook-signature"]),
    st.binary(max_size=20),
)
RAW_HEADERS = st.lists(st.tuples(NAMES, st.binary(max_size=200)), max_size=8)
VALID_IDS = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="."),
    min_size=1,
    max_size=255,
)


def verify(raw: list[tuple[bytes, bytes]], body: bytes, now: float) -> VerifiedDelivery | None:
    """Verify, and check that a refusal is a VerificationError that leaks no secret."""
    try:
        return VERIFIER.verify(Headers(raw=raw), body, now)
    except VerificationError as exc:
        refusal = exc
    assert refusal.status_code == (400 if isinstance(refusal, MalformedRequest) else 401)
    assert refusal.check
    assert SECRET_TEXT not in str(refusal)
    return None


@settings(max_examples=1500, deadline=None)
@given(raw=RAW_HEADERS, body=st.binary(max_size=300), offset=st.integers(-(10**13), 10**13))
@example(raw=[(b"webhook-id", b"a"), (b"webhook-timestamp", b"9" * 13)], body=b"", offset=0)
@example(raw=[(b"webhook-signature", b"v1," + b"\xff" * 44)], body=b"", offset=0)
def test_verification_is_total_on_arbitrary_headers(
    raw: list[tuple[bytes, bytes]], body: bytes, offset: int
) -> None:
    assert verify(raw, body, NOW + offset) is None  # nothing here carries a valid signature


def mostly(usual: st.SearchStrategy[T], unusual: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """``usual`` three times in four."""
    return st.integers(0, 3).flatmap(lambda i: unusual if i == 3 else usual)


ENTRY = st.one_of(
    st.sampled_from(["v1,", "v1a,", ",", "v1", "v1,!!!", "v2,abc", " "]),
    st.text(max_size=100),
    st.builds(
        lambda version, raw: f"{version},{base64.b64encode(raw).decode()}",
        st.sampled_from(["v1", "v1a"]),
        st.binary(max_size=70),
    ),
)


@settings(max_examples=1500, deadline=None)
@given(
    webhook_id=mostly(VALID_IDS, st.binary(max_size=40).map(lambda b: b.decode("latin-1"))),
    timestamp=mostly(
        st.integers(NOW - 400, NOW + 400).map(str),
        st.one_of(
            st.sampled_from(["1e9", "-5", " 123", "0x10", "123.0", "", "0", "9" * 13]),
            st.text(max_size=14),
        ),
    ),
    entries=st.lists(mostly(st.sampled_from(["valid", "valid-v1a"]), ENTRY), max_size=6),
    body=st.binary(max_size=200),
    duplicate=mostly(
        st.none(), st.sampled_from([b"webhook-id", b"webhook-timestamp", b"webhook-signature"])
    ),
)
def test_verification_is_total_on_structured_mutations(
    webhook_id: str, timestamp: str, entries: list[str], body: bytes, duplicate: bytes | None
) -> None:
    """Near-valid deliveries: the verdict is an answer or a VerificationError, and a delivery is
    only ever accepted with a valid signature over exactly the id, timestamp and body sent."""
    try:
        ts = int(timestamp)
    except ValueError:
        ts = NOW
    rendered = []
    for entry in entries:
        if entry == "valid":
            rendered.append(sign(SECRET, webhook_id, ts, body))
        elif entry == "valid-v1a":
            rendered.append(sign(PRIVATE_KEY, webhook_id, ts, body))
        else:
            rendered.append(entry)
    signature = " ".join(rendered)
    raw = [
        (b"webhook-id", webhook_id.encode("latin-1", "replace")),
        (b"webhook-timestamp", timestamp.encode("latin-1", "replace")),
        (b"webhook-signature", signature.encode("latin-1", "replace")),
    ]
    if duplicate is not None:
        raw.append((duplicate, dict(raw)[duplicate]))
    verified = verify(raw, body, NOW)
    event("accepted" if verified else "refused")
    if verified is not None:
        assert duplicate is None
        assert {"valid", "valid-v1a"} & set(entries)
        assert verified.webhook_id == webhook_id
        assert verified.timestamp is not None
        assert str(verified.timestamp) == timestamp
        assert abs(verified.timestamp - NOW) <= VERIFIER.tolerance


@settings(max_examples=300, deadline=None)
@given(webhook_id=VALID_IDS, data=st.text(max_size=300))
def test_agrees_with_the_reference_on_signed_deliveries(webhook_id: str, data: str) -> None:
    """What the reference signs we accept, and what we sign the reference accepts."""
    now = time.time()
    reference = Webhook(SECRET)
    stamp = dt.datetime.fromtimestamp(int(now), dt.UTC)
    theirs = reference.sign(webhook_id, stamp, data)
    headers = {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(now)),
        "webhook-signature": theirs,
    }
    body = data.encode()
    ours = VERIFIER.verify(Headers(headers=headers), body, now)
    assert ours.webhook_id == webhook_id
    headers["webhook-signature"] = sign(SECRET, webhook_id, int(now), body)
    reference.verify(body, headers, json_parse=False)


@pytest.mark.parametrize(
    ("signature", "body"),
    [
        ("v1", b"{}"),  # standardwebhooks < 1.3 raised ValueError unpacking split(",")
        ("v1,a,b", b"{}"),  # ditto, too many values
        ("v1,a", b"{}"),  # it raised binascii.Error from b64decode
        ("v1,abcde", b"{}"),  # ditto, incorrect padding
        ("valid", b"\xff\xfe"),  # it decoded the body first: UnicodeDecodeError
    ],
)
def test_inputs_that_crashed_the_reference_are_verification_errors(
    signature: str, body: bytes
) -> None:
    """Our promise: each of these inputs is a verification error, never a crash.

    The reference library crashed on them with raw ``ValueError`` or ``UnicodeDecodeError``
    before its 1.3 release, which is why verification is our own. Whatever the installed
    reference does (crash or its own ``WebhookVerificationError``), it must not *accept* a
    malformed signature, and our verifier must answer with ``None`` (the 401 path), not raise.
    """
    webhook_id = "msg_1"
    if signature == "valid":
        signature = sign(SECRET, webhook_id, NOW, body)
    headers = {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(NOW),
        "webhook-signature": signature,
    }
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    if signature.startswith("v1,") and len(signature) > 40:
        # Correctly signed bytes are verified: whether they are an event is the parser's call.
        assert verify(raw, body, NOW) is not None
    else:
        assert verify(raw, body, NOW) is None
    # Tolerant of the reference being fixed: old releases crash, 1.3 and later refuse.
    with pytest.raises((ValueError, UnicodeDecodeError, WebhookVerificationError)):
        Webhook(SECRET).verify(body, {**headers, "webhook-timestamp": str(int(time.time()))})
