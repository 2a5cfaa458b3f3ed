"""Standard Webhooks verification: published vectors, the reference library, and totality.

The `standardwebhooks` package is the reference. Its Webhook.verify is only well defined on part
of the input space (it decodes the body as UTF-8, unpacks every entry as exactly one comma,
decodes base64 leniently and parses the timestamp with float()), so the differential tests stay
inside that part; everywhere else our stricter rules are tested on their own.
"""

from __future__ import annotations

import base64
import os
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from receiver._exceptions import ConfigurationError, MalformedRequest, VerificationError
from receiver._verification.verifier import (
    MAX_SIGNATURE_ENTRIES,
    MAX_SIGNATURE_HEADER,
    StandardWebhooks,
    VerifiedDelivery,
    Verifier,
    generate_keypair,
    generate_secret,
    sign,
)

# Published by standard-webhooks/standard-webhooks, libraries/python/tests/test_webhooks.py
# (test_sign_function, test_invalid_signature_raises_error, test_multi_sig_payload_is_valid).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
VECTOR_NEAR_MISS = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="
VECTOR_DECOY = "Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="

# The spec publishes no v1a vector with its key, so: the RFC 8032 section 7.1 TEST 1 key pair
# (checks our whsk_ -> public key derivation), and a v1a signature of the published v1 message
# made with it. Ed25519 is deterministic, so the value is pinned as a regression vector.
RFC8032_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC8032_WHSK = "whsk_" + base64.b64encode(RFC8032_SEED).decode()
RFC8032_WHPK = "whpk_" + base64.b64encode(RFC8032_PUBLIC).decode()
PINNED_V1A = (
    "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw=="
)

Value = str | bytes


def raw_headers(*pairs: tuple[str, Value]) -> Headers:
    """Headers exactly as an ASGI server hands them over: lowercase names, latin-1 bytes."""
    return Headers(
        raw=[
            (name.encode(), value if isinstance(value, bytes) else value.encode("latin-1"))
            for name, value in pairs
        ]
    )


def webhook_headers(
    msg_id: Value = VECTOR_ID,
    timestamp: Value = str(VECTOR_TS),
    signature: Value = VECTOR_SIGNATURE,
) -> Headers:
    return raw_headers(
        ("content-type", "application/json"),
        ("webhook-id", msg_id),
        ("webhook-timestamp", timestamp),
        ("webhook-signature", signature),
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def whsec(key: bytes) -> str:
    return "whsec_" + b64(key)


@pytest.fixture
def vector_verifier() -> StandardWebhooks:
    return StandardWebhooks([VECTOR_SECRET])


def rejected(verifier: StandardWebhooks, headers: Headers, body: bytes, now: float) -> str:
    """Return the failed check's name; fail the test on any other outcome."""
    with pytest.raises(VerificationError) as info:
        verifier.verify(headers, body, now)
    return info.value.check


# --- published vectors ---------------------------------------------------------------------


def test_sign_reproduces_the_published_vector() -> None:
    assert sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIGNATURE


def test_published_vector_verifies(vector_verifier: StandardWebhooks) -> None:
    delivery = vector_verifier.verify(webhook_headers(), VECTOR_BODY, VECTOR_TS)
    assert delivery == VerifiedDelivery(VECTOR_ID, VECTOR_TS, None)


def test_published_near_miss_is_rejected(vector_verifier: StandardWebhooks) -> None:
    headers = webhook_headers(signature=VECTOR_NEAR_MISS)
    with pytest.raises(VerificationError) as info:
        vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS)
    assert type(info.value) is VerificationError  # 401, not the 400 of MalformedRequest
    assert info.value.check == "signature"
    assert info.value.status_code == 401
    assert VECTOR_NEAR_MISS[3:] not in str(info.value)


def test_published_multi_signature_list(vector_verifier: StandardWebhooks) -> None:
    signature = f"v1,{VECTOR_DECOY} v2,{VECTOR_DECOY} {VECTOR_SIGNATURE} v1,{VECTOR_DECOY}"
    delivery = vector_verifier.verify(webhook_headers(signature=signature), VECTOR_BODY, VECTOR_TS)
    assert delivery.webhook_id == VECTOR_ID


def test_raw_bytes_secret_is_the_hmac_key() -> None:
    key = base64.b64decode(VECTOR_SECRET.removeprefix("whsec_"))
    assert sign(key, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIGNATURE
    StandardWebhooks([key]).verify(webhook_headers(), VECTOR_BODY, VECTOR_TS)


def test_secret_padding_and_surrounding_whitespace_are_tolerated() -> None:
    key = os.urandom(32)  # 44 base64 characters, one "=" of padding
    unpadded = whsec(key).rstrip("=")
    verifier = StandardWebhooks([f"  {unpadded}\n"])
    signature = sign(key, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    verifier.verify(webhook_headers(signature=signature), VECTOR_BODY, VECTOR_TS)


def test_rfc8032_key_pair_and_pinned_v1a_vector() -> None:
    assert sign(RFC8032_WHSK, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == PINNED_V1A
    # Independently of our code: the pinned value is a valid ed25519 signature of the content.
    content = f"{VECTOR_ID}.{VECTOR_TS}.".encode() + VECTOR_BODY
    public = Ed25519PublicKey.from_public_bytes(RFC8032_PUBLIC)
    public.verify(base64.b64decode(PINNED_V1A[4:]), content)
    headers = webhook_headers(signature=PINNED_V1A)
    for secret in (RFC8032_WHPK, RFC8032_WHSK, "whsk_" + b64(RFC8032_SEED + RFC8032_PUBLIC)):
        StandardWebhooks([secret]).verify(headers, VECTOR_BODY, VECTOR_TS)


# --- rotation and schemes ------------------------------------------------------------------


def test_rotation_accepts_any_configured_secret_in_any_entry() -> None:
    old, new, stranger = generate_secret(), generate_secret(), generate_secret()
    verifier = StandardWebhooks([old, new])
    by = {s: sign(s, VECTOR_ID, VECTOR_TS, VECTOR_BODY) for s in (old, new, stranger)}
    for signature in (
        by[old],
        by[new],
        f"{by[old]} {by[new]}",
        f"{by[stranger]} {by[new]}",
        f"v1,{VECTOR_DECOY}  {by[stranger]}   {by[old]}",  # repeated spaces are not entries
    ):
        delivery = verifier.verify(webhook_headers(signature=signature), VECTOR_BODY, VECTOR_TS)
        assert delivery.webhook_id == VECTOR_ID
    headers = webhook_headers(signature=by[stranger])
    assert rejected(verifier, headers, VECTOR_BODY, VECTOR_TS) == "signature"


def test_mixed_v1_and_v1a_secrets() -> None:
    hmac_secret = generate_secret()
    private, public = generate_keypair()
    verifier = StandardWebhooks([hmac_secret, public])
    v1 = sign(hmac_secret, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    v1a = sign(private, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    assert v1.startswith("v1,")
    assert v1a.startswith("v1a,")
    for signature in (v1, v1a, f"{v1a} {v1}", f"v1a,{VECTOR_DECOY} {v1a}"):
        verifier.verify(webhook_headers(signature=signature), VECTOR_BODY, VECTOR_TS)
    # Each scheme is checked only against keys of its own kind, and only for its own body.
    for only, signature, body in (
        (StandardWebhooks([hmac_secret]), v1a, VECTOR_BODY),
        (StandardWebhooks([public]), v1, VECTOR_BODY),
        (verifier, v1a, VECTOR_BODY + b" "),
    ):
        headers = webhook_headers(signature=signature)
        assert rejected(only, headers, body, VECTOR_TS) == "signature"


def test_generated_secrets_have_the_documented_shapes() -> None:
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[6:])) == 24
    private, public = generate_keypair()
    assert len(base64.b64decode(private.removeprefix("whsk_"))) == 32
    assert len(base64.b64decode(public.removeprefix("whpk_"))) == 32
    # The reference library understands our whsec_ secrets.
    theirs = standardwebhooks.Webhook(secret)
    stamp = datetime.fromtimestamp(VECTOR_TS, tz=UTC)
    assert theirs.sign(VECTOR_ID, stamp, VECTOR_BODY.decode()) == sign(
        secret, VECTOR_ID, VECTOR_TS, VECTOR_BODY
    )


def test_non_utf8_body_verifies_on_bytes() -> None:
    # The reference library raises UnicodeDecodeError here; rejecting a non-JSON body is the
    # parse step's job (400), not the signature's.
    body = b"\xff\xfe\x00binary"
    signature = sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, body)
    StandardWebhooks([VECTOR_SECRET]).verify(webhook_headers(signature=signature), body, VECTOR_TS)


def test_mapping_headers_are_lowercased_by_starlette(vector_verifier: StandardWebhooks) -> None:
    headers = Headers(
        {
            "Webhook-Id": VECTOR_ID,
            "Webhook-Timestamp": str(VECTOR_TS),
            "WEBHOOK-SIGNATURE": VECTOR_SIGNATURE,
        }
    )
    assert vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS).timestamp == VECTOR_TS


def test_standard_webhooks_is_a_verifier() -> None:
    verifier: Verifier = StandardWebhooks([VECTOR_SECRET])
    assert verifier.verify(webhook_headers(), VECTOR_BODY, VECTOR_TS).event_type is None


# --- timestamp tolerance -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tolerance", "now", "outcome"),
    [
        (300.0, VECTOR_TS, None),
        (300.0, VECTOR_TS + 300, None),  # the bound itself is inside
        (300.0, VECTOR_TS - 300, None),
        (300.0, VECTOR_TS + 300.001, "too old"),
        (300.0, VECTOR_TS - 300.001, "too new"),
        (300.0, VECTOR_TS + 86_400, "too old"),
        (0.0, VECTOR_TS, None),
        (0.0, VECTOR_TS + 0.5, "too old"),
        (0.0, VECTOR_TS - 0.5, "too new"),
        (3600.0, VECTOR_TS + 3599, None),
        (3600.0, VECTOR_TS - 3601, "too new"),
    ],
)
def test_timestamp_tolerance_in_both_directions(
    tolerance: float, now: float, outcome: str | None
) -> None:
    verifier = StandardWebhooks([VECTOR_SECRET], tolerance=tolerance)
    if outcome is None:
        assert verifier.verify(webhook_headers(), VECTOR_BODY, now).timestamp == VECTOR_TS
        return
    with pytest.raises(VerificationError, match=outcome) as info:
        verifier.verify(webhook_headers(), VECTOR_BODY, now)
    assert type(info.value) is VerificationError
    assert info.value.check == "timestamp"


def test_stale_timestamp_is_refused_even_with_a_valid_signature() -> None:
    # A replayed, genuinely signed delivery from long ago: the clock check is what stops it.
    verifier = StandardWebhooks([VECTOR_SECRET])
    assert rejected(verifier, webhook_headers(), VECTOR_BODY, time.time()) == "timestamp"


# --- malformed headers ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_or_empty_header(vector_verifier: StandardWebhooks, name: str) -> None:
    values = {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TS),
        "webhook-signature": VECTOR_SIGNATURE,
    }
    absent = raw_headers(*((k, v) for k, v in values.items() if k != name))
    empty = raw_headers(*((k, "" if k == name else v) for k, v in values.items()))
    for headers in (absent, empty):
        with pytest.raises(MalformedRequest) as info:
            vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS)
        assert info.value.check == f"missing_header:{name}"
        assert info.value.status_code == 400


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
@pytest.mark.parametrize("same_value", [True, False])
def test_duplicated_header(vector_verifier: StandardWebhooks, name: str, same_value: bool) -> None:
    values = {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TS),
        "webhook-signature": VECTOR_SIGNATURE,
    }
    second = values[name] if same_value else {"webhook-id": "msg_other"}.get(name, "1")
    headers = raw_headers(("accept", "*/*"), *values.items(), ("accept", "*/*"), (name, second))
    with pytest.raises(MalformedRequest) as info:
        vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS)
    assert info.value.check == f"duplicate_header:{name}"


def test_other_repeated_headers_are_fine(vector_verifier: StandardWebhooks) -> None:
    headers = raw_headers(
        ("x-forwarded-for", "10.0.0.1"),
        ("webhook-id", VECTOR_ID),
        ("webhook-timestamp", str(VECTOR_TS)),
        ("webhook-signature", VECTOR_SIGNATURE),
        ("x-forwarded-for", "10.0.0.2"),
    )
    assert vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS).webhook_id == VECTOR_ID


@pytest.mark.parametrize(
    "msg_id",
    [
        "msg.1",  # "." is the signed-content separator
        ".",
        "msg 1",
        "msg\t1",
        "msg\x00",
        "msg\x1f",
        "msg\x7f",  # DEL
        "msg_é",  # latin-1, not ASCII
        b"msg_\xff",
        "x" * 256,
    ],
)
def test_bad_webhook_id_is_malformed_even_when_signed(msg_id: Value) -> None:
    text = msg_id if isinstance(msg_id, str) else msg_id.decode("latin-1")
    signature = sign(VECTOR_SECRET, text, VECTOR_TS, VECTOR_BODY)
    headers = webhook_headers(msg_id=msg_id, signature=signature)
    with pytest.raises(MalformedRequest) as info:
        StandardWebhooks([VECTOR_SECRET]).verify(headers, VECTOR_BODY, VECTOR_TS)
    assert info.value.check == "webhook_id"


def test_longest_and_most_varied_webhook_id() -> None:
    for msg_id in ("x" * 255, "!\"#$%&'()*+,-/09:;<=>?@AZ[\\]^_`az{|}~"):
        signature = sign(VECTOR_SECRET, msg_id, VECTOR_TS, VECTOR_BODY)
        headers = webhook_headers(msg_id=msg_id, signature=signature)
        delivery = StandardWebhooks([VECTOR_SECRET]).verify(headers, VECTOR_BODY, VECTOR_TS)
        assert delivery.webhook_id == msg_id


@pytest.mark.parametrize(
    "timestamp",
    [
        "hello",
        "-1614265330",
        "+1614265330",
        "1614265330.0",
        "1614265330.5",
        "1.6e9",
        "0x60380ef2",
        " 1614265330",
        "1614265330 ",
        "16142 65330",
        "01614265330",  # would be signed as "01614265330", unlike the integer it denotes
        "1" * 13,
        "¹²³",  # latin-1 digits that str.isdigit() accepts
        b"161426533\xb2",
        "NaN",
        "inf",
    ],
)
def test_bad_timestamp_is_malformed(vector_verifier: StandardWebhooks, timestamp: Value) -> None:
    with pytest.raises(MalformedRequest) as info:
        vector_verifier.verify(webhook_headers(timestamp=timestamp), VECTOR_BODY, VECTOR_TS)
    assert info.value.check == "timestamp"


def test_huge_but_well_formed_timestamp_is_too_new(vector_verifier: StandardWebhooks) -> None:
    headers = webhook_headers(timestamp="9" * 12)
    with pytest.raises(VerificationError, match="too new") as info:
        vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS)
    assert type(info.value) is VerificationError


@pytest.mark.parametrize(
    "entry",
    [
        "v1",  # no comma
        "v1,",
        ",",
        "v1,!!!!",
        "v1," + VECTOR_DECOY.rstrip("="),  # unpadded
        "v1," + VECTOR_DECOY[:-2] + "==",  # 31 bytes
        "v1," + b64(os.urandom(33)),  # wrong length
        "v1," + "é" * 44,  # non-ASCII
        "v1,\x00" + VECTOR_DECOY[1:],
        "v1a," + VECTOR_DECOY,  # v1a needs 64 bytes
        "v1a," + "=" * 88,
        "v2," + VECTOR_DECOY,  # unknown version
        "V1," + VECTOR_SIGNATURE[3:],  # versions are case-sensitive
        "v1,," + VECTOR_SIGNATURE[3:],
    ],
)
def test_malformed_entries_are_ignored(vector_verifier: StandardWebhooks, entry: str) -> None:
    alone = webhook_headers(signature=entry)
    assert rejected(vector_verifier, alone, VECTOR_BODY, VECTOR_TS) == "signature"
    beside_a_valid_one = webhook_headers(signature=f"{entry} {VECTOR_SIGNATURE}")
    vector_verifier.verify(beside_a_valid_one, VECTOR_BODY, VECTOR_TS)


@pytest.mark.parametrize(
    "signature",
    [
        " ",
        "     ",
        " ".join([f"v1,{VECTOR_DECOY}"] * MAX_SIGNATURE_ENTRIES + [VECTOR_SIGNATURE]),
        "v1," + "A" * MAX_SIGNATURE_HEADER,
    ],
)
def test_structurally_bad_signature_header(
    vector_verifier: StandardWebhooks, signature: str
) -> None:
    with pytest.raises(MalformedRequest) as info:
        vector_verifier.verify(webhook_headers(signature=signature), VECTOR_BODY, VECTOR_TS)
    assert info.value.check == "signature"


def test_signature_entry_limit_is_inclusive(vector_verifier: StandardWebhooks) -> None:
    entries = [f"v1,{VECTOR_DECOY}"] * (MAX_SIGNATURE_ENTRIES - 1) + [VECTOR_SIGNATURE]
    headers = webhook_headers(signature=" ".join(entries))
    vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS)


def test_malformed_beats_the_clock(vector_verifier: StandardWebhooks) -> None:
    # A malformed delivery is a 400 whenever it arrives, not a 401 that depends on the clock.
    headers = webhook_headers(signature=" ")
    with pytest.raises(MalformedRequest):
        vector_verifier.verify(headers, VECTOR_BODY, VECTOR_TS + 10_000)


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("secrets", "fragment"),
    [
        ([], "at least one"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "list"),
        (["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], "prefix"),  # the reference accepts a bare one
        (["whsec_"], "empty"),
        (["whsec_not base64!"], "base64"),
        (["whsec_Zm9vYmFy\u00e9"], "base64"),
        ([b""], "empty"),
        (["whpk_" + b64(os.urandom(31))], "32-byte"),
        (["whsk_" + b64(os.urandom(48))], "32-byte"),
        (["whsk_" + b64(os.urandom(64))], "does not match"),
        (["whkey_" + b64(os.urandom(32))], "prefix"),
        ([generate_secret(), 42], "str"),
    ],
)
def test_bad_secrets_fail_at_construction(secrets: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment) as info:
        StandardWebhooks(secrets)  # type: ignore[arg-type]
    if isinstance(secrets, list):  # the message never echoes the key material
        for secret in secrets:
            if isinstance(secret, str) and len(secret) > 20:
                assert secret[-16:] not in str(info.value)


@pytest.mark.parametrize("tolerance", [-1.0, float("nan"), float("inf"), True, "300"])
def test_bad_tolerance(tolerance: float) -> None:
    with pytest.raises(ConfigurationError, match="tolerance"):
        StandardWebhooks([generate_secret()], tolerance=tolerance)


def test_signing_needs_a_signing_key() -> None:
    _, public = generate_keypair()
    with pytest.raises(ConfigurationError, match="whsk_"):
        sign(public, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    with pytest.raises(ConfigurationError):
        sign("whsec_!!", VECTOR_ID, VECTOR_TS, VECTOR_BODY)


def test_repr_never_shows_secrets() -> None:
    raw_key = os.urandom(32)
    private, public = generate_keypair()
    secret = generate_secret()
    verifier = StandardWebhooks([secret, raw_key, public, private], tolerance=60)
    shown = repr(verifier) + str(verifier)
    for value in (secret, public, private):
        assert value.partition("_")[2][:12] not in shown
    assert repr(raw_key) not in shown
    assert raw_key.hex()[:12] not in shown
    assert b64(raw_key)[:12] not in shown
    assert "v1_keys=2" in shown
    assert "v1a_keys=2" in shown


# --- differential tests against the standardwebhooks package -------------------------------

ids = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="."),
    min_size=1,
    max_size=60,
)
# The reference decodes the body as UTF-8 before signing, so only UTF-8 bodies compare.
utf8_bodies = st.text(max_size=300).map(str.encode)
hmac_keys = st.binary(min_size=1, max_size=100)  # over 64 bytes, HMAC hashes the key first
# The reference always checks against the real clock; stay well inside its 5 minutes.
clock_offsets = st.integers(min_value=-200, max_value=200)


def their_verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        standardwebhooks.Webhook(secret).verify(body, headers, json_parse=False)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


def our_verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        StandardWebhooks([secret]).verify(raw_headers(*headers.items()), body, time.time())
    except VerificationError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(key=hmac_keys, msg_id=ids, offset=clock_offsets, body=utf8_bodies)
def test_signatures_agree_with_the_reference(
    key: bytes, msg_id: str, offset: int, body: bytes
) -> None:
    secret = whsec(key)
    ts = int(time.time()) + offset
    theirs = standardwebhooks.Webhook(secret).sign(
        msg_id, datetime.fromtimestamp(ts, tz=UTC), body.decode()
    )
    ours = sign(secret, msg_id, ts, body)
    assert ours == theirs
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": theirs}
    assert our_verify(secret, headers, body)
    assert their_verify(secret, headers, body)


B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


@st.composite
def tampered(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    """A validly signed delivery, then one random change that stays where the reference is
    well defined: UTF-8 body, canonical timestamp, entries with one comma and strict base64."""
    secret = whsec(draw(hmac_keys))
    msg_id = draw(ids)
    ts = int(time.time()) + draw(clock_offsets)
    body = draw(utf8_bodies)
    entries = [sign(secret, msg_id, ts, body)]
    kind = draw(
        st.sampled_from(
            ["none", "body", "id", "timestamp", "signature_char", "secret", "decoys", "version"]
        )
    )
    if kind == "body":
        body = draw(utf8_bodies)
    elif kind == "id":
        msg_id = draw(ids)
    elif kind == "timestamp":
        # Far outside or well inside the reference's 300 s, never near its edge (its clock is
        # its own): offsets stay within 200 s, so a shift lands within 231 s or beyond 400 s.
        ts += draw(st.sampled_from([-1, 1, 31, -31, 600, -600, 10_000]))
    elif kind == "signature_char":
        encoded = entries[0][3:]
        position = draw(st.integers(min_value=0, max_value=42))  # leave the "=" alone
        char = draw(st.sampled_from(B64_ALPHABET))
        entries[0] = "v1," + encoded[:position] + char + encoded[position + 1 :]
    elif kind == "secret":
        secret = whsec(draw(hmac_keys))
    elif kind == "decoys":
        decoys = draw(
            st.lists(
                st.tuples(st.sampled_from(["v1", "v1a", "v2"]), st.binary(max_size=66)).map(
                    lambda pair: f"{pair[0]},{b64(pair[1])}"
                ),
                max_size=4,
            )
        )
        keep = draw(st.booleans())
        entries = [*decoys, *entries] if keep else decoys or [f"v1,{VECTOR_DECOY}"]
    elif kind == "version":
        entries[0] = draw(st.sampled_from(["v1a", "v2", "v0"])) + entries[0][2:]
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(entries),
    }
    return secret, headers, body


@settings(max_examples=300, deadline=None)
@given(case=tampered())
def test_tampering_is_rejected_exactly_when_the_reference_rejects(
    case: tuple[str, dict[str, str], bytes],
) -> None:
    secret, headers, body = case
    assert our_verify(secret, headers, body) == their_verify(secret, headers, body)


def test_a_signature_spelled_with_nonzero_trailing_bits_is_refused() -> None:
    # 32 bytes in base64 leave two unused bits in the last character before "=": flipping one
    # spells the same bytes, which a lenient decoder accepts and the reference refuses.
    secret = whsec(b"k" * 24)
    ts = int(time.time())
    signed = sign(secret, "msg_1", ts, b"{}")
    last = signed[-2]
    other = B64_ALPHABET[B64_ALPHABET.index(last) ^ 1]
    respelled = signed[:-2] + other + "="
    assert base64.b64decode(respelled[3:]) == base64.b64decode(signed[3:])
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(ts)}
    assert our_verify(secret, {**headers, "webhook-signature": signed}, b"{}")
    assert not their_verify(secret, {**headers, "webhook-signature": respelled}, b"{}")
    assert not our_verify(secret, {**headers, "webhook-signature": respelled}, b"{}")


# --- totality ------------------------------------------------------------------------------

PRIVATE, PUBLIC = generate_keypair()
TOTAL_VERIFIER = StandardWebhooks([VECTOR_SECRET, PUBLIC])
latin1_text = st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=120)
header_values = latin1_text | st.binary(max_size=120)
near_signatures = st.lists(
    st.tuples(
        st.sampled_from(["v1", "v1a", "v2", "", "v1,v1"]),
        st.sampled_from([",", "", ",,", ", "]),
        st.binary(max_size=70).map(b64) | latin1_text,
    ).map("".join),
    max_size=40,
).map(" ".join)


@st.composite
def hostile_headers(draw: st.DrawFn) -> Headers:
    pairs: list[tuple[str, Value]] = []
    for name, typical in (
        ("webhook-id", ids),
        ("webhook-timestamp", st.integers(min_value=-(10**14), max_value=10**14).map(str)),
        ("webhook-signature", near_signatures),
    ):
        for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
            pairs.append((name, draw(typical | header_values)))
    pairs += draw(st.lists(st.tuples(st.sampled_from(["accept", "x-other"]), header_values)))
    return raw_headers(*draw(st.permutations(pairs)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=hostile_headers(), body=st.binary(max_size=200), now=st.floats(0, 2e12))
def test_verify_is_total(headers: Headers, body: bytes, now: float) -> None:
    # Nothing here carries a real signature, so nothing may verify, and nothing but our own
    # error may escape.
    with pytest.raises(VerificationError) as info:
        TOTAL_VERIFIER.verify(headers, body, now)
    assert info.value.check
    assert isinstance(str(info.value), str)


@settings(max_examples=150, deadline=None)
@given(
    msg_id=ids,
    body=st.binary(max_size=200),
    junk=st.lists(st.sampled_from(["v1,", "v1a,", "v2,x", "é", "\x00"]), max_size=3),
)
def test_valid_signatures_survive_surrounding_junk(
    msg_id: str, body: bytes, junk: list[str]
) -> None:
    v1 = sign(VECTOR_SECRET, msg_id, VECTOR_TS, body)
    v1a = sign(PRIVATE, msg_id, VECTOR_TS, body)
    for signature in (v1, v1a):
        headers = webhook_headers(msg_id, str(VECTOR_TS), " ".join([*junk, signature, *junk]))
        delivery = TOTAL_VERIFIER.verify(headers, body, VECTOR_TS)
        assert delivery == VerifiedDelivery(msg_id, VECTOR_TS)
