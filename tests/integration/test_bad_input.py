"""T6, bad input fuzzing: invariant I5 on SQLite and PostgreSQL.

No input (headers, body, sizes, encodings, framing) yields a 5xx or an exception escaping the
ASGI app, and input that is not correctly signed never reaches the store. Correctly signed input
that is not a valid event is answered 400 and recorded as final (one row in state 'failed').

The app is driven over raw ASGI with hand-built scopes, so that header lists can repeat names and
carry arbitrary latin-1 bytes, and bodies can arrive in chunks under a lying Content-Length.
Hypothesis and pytest-asyncio do not share an event loop well, so every test owns one
(``asyncio.Runner``), opens its own store and receiver in it, and runs each example in it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from receiver import (
    Event,
    PostgresStore,
    Provider,
    Receiver,
    SQLiteStore,
    Store,
    generate_keypair,
    sign,
)
from receiver._store.base import Connection
from receiver._verification.verifier import MAX_SIGNATURE_ENTRIES, MAX_SIGNATURE_HEADER
from tests.conftest import truncate
from tests.support import PROVIDER, SECRET, T0, Clock, body_of

# A second HMAC secret (for rotation) and an ed25519 pair, so that v1 and v1a are both live.
ROTATED = "whsec_" + base64.b64encode(b"rotated-secret-for-the-t6-tests!").decode()
PRIVATE_KEY, PUBLIC_KEY = generate_keypair()
# Valid syntax, but not configured: its signatures must never verify.
STRANGER = "whsec_" + base64.b64encode(b"a-secret-this-receiver-never-had").decode()
TOLERANCE = 300
NOW = int(T0)
SMALL_MAX = 4096  # the fuzzed receiver's max_body_size
DEFAULT_MAX = 1024 * 1024

Headers = list[tuple[bytes, bytes]]

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# -- the harness: one event loop, one store, one receiver per test ---------------------------


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def error(self) -> str:
        decoded = orjson.loads(self.body)
        assert isinstance(decoded, dict), self
        code = decoded.get("error")
        assert isinstance(code, str), self
        return code


@dataclass
class Harness:
    runner: asyncio.Runner
    store: Store
    rx: Receiver
    handled: list[str] = field(default_factory=list)
    _handled_mark: int = 0
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def fresh_id(self) -> str:
        return f"msg_t6_{next(self._ids)}"

    def post(
        self,
        headers: Headers,
        chunks: Sequence[bytes] = (b"",),
        *,
        path: str = f"/{PROVIDER}",
        method: str = "POST",
    ) -> Answer:
        sent = self.send_raw(headers, chunks, path=path, method=method)
        starts = [m for m in sent if m["type"] == "http.response.start"]
        assert len(starts) == 1, sent
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return Answer(starts[0]["status"], dict(starts[0].get("headers", [])), body)

    def send_raw(
        self,
        headers: Headers,
        chunks: Sequence[bytes],
        *,
        path: str = f"/{PROVIDER}",
        method: str = "POST",
        disconnect_after: int | None = None,
    ) -> list[dict[str, Any]]:
        """The ASGI messages the app sent. Any exception escaping it fails the test."""
        return self.runner.run(call(self.rx, headers, chunks, path, method, disconnect_after))

    def mark(self) -> int:
        """The receipt count before a request; also remembers how many handler runs there were."""
        self._handled_mark = len(self.handled)
        return self.rows()

    def rows(self) -> int:
        return int(self._fetchval("SELECT count(*) FROM receiver_receipts"))

    def state(self, webhook_id: str) -> str | None:
        found = self._fetchval(
            "SELECT state FROM receiver_receipts WHERE provider = $1 AND webhook_id = $2",
            PROVIDER,
            webhook_id,
        )
        return None if found is None else str(found)

    def _fetchval(self, query: str, *args: Any) -> Any:
        async def go() -> Any:
            async with self.store.acquire() as conn:
                return await conn.fetchval(query, *args)

        return self.runner.run(go())


async def call(
    app: Receiver,
    headers: Headers,
    chunks: Sequence[bytes],
    path: str,
    method: str,
    disconnect_after: int | None,
) -> list[dict[str, Any]]:
    """One raw ASGI request; returns what the app sent."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks or [b""])
    ]
    if disconnect_after is not None:
        messages = [*messages[:disconnect_after], {"type": "http.disconnect"}]
    pending = iter(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        # After the body a real server reports the disconnect once the client goes away.
        return next(pending, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw_path = path.encode("utf-8", "surrogateescape")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "root_path": "",
        "query_string": b"",
        "headers": list(headers),
        "client": ("203.0.113.7", 40000),
        "server": ("receiver.test", 80),
        "state": {},
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    return sent


def build(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "t6.db")
    url: str = request.getfixturevalue("pg_url")
    asyncio.run(truncate(url))
    return PostgresStore(url, max_size=4)


def open_harness(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, max_body: int
) -> Iterator[Harness]:
    with asyncio.Runner() as runner:
        store = build(kind, request, tmp_path)
        rx = Receiver(
            store,
            [Provider(PROVIDER, [SECRET, ROTATED, PUBLIC_KEY], tolerance=TOLERANCE)],
            clock=Clock(T0),
            max_body_size=max_body,
        )
        harness = Harness(runner, store, rx)

        @rx.on("order.*")
        async def handle(delivered: Event, tx: Connection) -> dict[str, Any]:
            harness.handled.append(delivered.id)
            return {"seen": delivered.type, "fence": delivered.fence}

        runner.run(rx.open())
        try:
            yield harness
        finally:
            runner.run(rx.close())


@pytest.fixture(params=["sqlite", "postgresql"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A receiver with a small max_body_size, so oversized bodies are cheap to fuzz."""
    yield from open_harness(request.param, request, tmp_path, SMALL_MAX)


@pytest.fixture(params=["sqlite", "postgresql"])
def default_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A receiver with the default 1 MiB limit."""
    yield from open_harness(request.param, request, tmp_path, DEFAULT_MAX)


# -- the properties ---------------------------------------------------------------------------


def check_answer(answer: Answer) -> None:
    """I5 on the wire: never 5xx, never 410, and every 4xx is the receiver's JSON error."""
    assert 200 <= answer.status < 500, answer
    assert answer.status != 410, answer
    if answer.status >= 400:
        answer.error()


def check_refused(harness: Harness, before: int, answer: Answer) -> None:
    """Input that is not correctly signed: a 4xx and not a single new row."""
    check_answer(answer)
    assert 400 <= answer.status < 500, answer
    assert harness.rows() == before, answer
    assert len(harness.handled) == harness._handled_mark, answer


def check_accepted(harness: Harness, before: int, webhook_id: str, answer: Answer) -> None:
    """Correctly signed input: 200 and a completed receipt, or 400 and a failed one."""
    check_answer(answer)
    assert harness.rows() == before + 1, answer
    state = harness.state(webhook_id)
    if answer.status == 200:
        assert state == "completed", (answer, state)
    else:
        assert answer.status == 400, answer
        assert answer.error() == "invalid_payload", answer
        assert state == "failed", (answer, state)


def webhook_headers(
    webhook_id: str | bytes, timestamp: str | bytes, signature: str | bytes, **extra: bytes
) -> Headers:
    def raw(value: str | bytes) -> bytes:
        return value if isinstance(value, bytes) else value.encode("latin-1")

    headers = [
        (b"webhook-id", raw(webhook_id)),
        (b"webhook-timestamp", raw(timestamp)),
        (b"webhook-signature", raw(signature)),
        (b"content-type", b"application/json"),
    ]
    headers += [(name.replace("_", "-").encode(), value) for name, value in extra.items()]
    return headers


def signed_headers(webhook_id: str, body: bytes, timestamp: int = NOW) -> Headers:
    return webhook_headers(webhook_id, str(timestamp), sign(SECRET, webhook_id, timestamp, body))


# -- strategies ------------------------------------------------------------------------------

VALID_ID = re.compile(rb"[\x21-\x2d\x2f-\x7e]{1,255}")
GARBAGE_IDS = st.one_of(
    st.binary(max_size=300),
    st.sampled_from(
        [
            b"",
            b" ",
            b"msg.1",
            b".",
            b"msg\x00id",
            b"x" * 256,
            b"x" * 300,
            b" msg_1",
            b"msg_1 ",
            b"msg 1",
            b"\xff\xfe\xfd",
            "m\u00e9sg".encode("latin-1"),
            "m\u00e9sg".encode(),
            b"msg\r\n1",
            b"msg\t1",
        ]
    ),
)
GARBAGE_TIMESTAMPS = st.one_of(
    st.binary(max_size=24),
    st.sampled_from(
        [
            b"",
            b"1e9",
            b"-5",
            b" 123",
            b"0x10",
            b"123.0",
            b"+" + str(NOW).encode(),
            b"0" + str(NOW).encode(),
            str(NOW).encode() + b" ",
            b" " + str(NOW).encode(),
            str(NOW).encode() + b".0",
            b"9" * 13,
            b"9" * 5000,
            b"NaN",
            b"inf",
            b"\xb9\xb2\xb3",  # superscript digits: str.isdigit() is True, int() refuses
            str(NOW).encode().replace(b"1", b"\xb9"),
            str(NOW - TOLERANCE - 1).encode(),
            str(NOW + TOLERANCE + 1).encode(),
            b"0",
            b"1",
            b"999999999999",
        ]
    ),
)
GARBAGE_ENTRIES = st.one_of(
    st.binary(max_size=120),
    st.sampled_from(
        [
            b"v1,",
            b"v1a,",
            b",",
            b"v1",
            b"v1,,",
            b"v2," + base64.b64encode(bytes(32)),
            b"v1," + base64.b64encode(bytes(32)),
            b"v1," + base64.b64encode(bytes(32))[:-1] + b"!",
            b"v1," + b"=" * 44,
            b"v1," + b"A" * 43 + b"\xff",
            b"v1," + base64.b64encode(bytes(31)),
            b"v1," + base64.b64encode(bytes(33)),
            b"v1," + base64.urlsafe_b64encode(b"\xfb" * 32),
            b"v1a," + base64.b64encode(bytes(64)),
            b"v1a," + base64.b64encode(bytes(63)) + b"==",
            b"v1a," + b"*" * 88,
            b"V1," + base64.b64encode(bytes(32)),
            b"v1 ," + base64.b64encode(bytes(32)),
        ]
    ),
)
SEPARATORS = st.sampled_from([b" ", b"  ", b",", b", ", b"\t", b" , "])
EXTRA_NAMES = st.one_of(
    st.sampled_from(
        [
            b"content-type",
            b"user-agent",
            b"x-forwarded-for",
            b"x-kong-request-id",
            b"Webhook-Id",
            b"WEBHOOK-SIGNATURE",
            b"webhook-id ",
            b"svix-id",
            b"svix-signature",
            b"transfer-encoding",
            b"idempotency-key",
        ]
    ),
    st.binary(min_size=1, max_size=30),
)
EXTRA_HEADERS = st.lists(
    st.tuples(EXTRA_NAMES, st.binary(max_size=200)).filter(
        lambda h: (
            h[0] not in (b"content-length", b"webhook-id", b"webhook-timestamp")
            and h[0] != b"webhook-signature"
        )
    ),
    max_size=4,
)

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Valid event types: 1-255 characters without control characters (C0, DEL); anything else is
# an invalid payload, tested below.
EVENT_TYPES = st.one_of(
    st.sampled_from(["order.created", "order.", "order.x.y", "invoice.paid", "*", "order.*"]),
    st.text(
        alphabet=st.characters(
            blacklist_categories=("Cs",), blacklist_characters=[*map(chr, range(0x20)), "\x7f"]
        ),
        min_size=1,
        max_size=40,
    ),
)
VALID_EVENTS = st.builds(
    lambda event_type, data, extra: orjson.dumps({**extra, "type": event_type, "data": data}),
    EVENT_TYPES,
    JSON_VALUES,
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "type"), JSON_VALUES, max_size=3),
)
INVALID_PAYLOADS = st.one_of(
    st.just(b""),
    st.binary(max_size=300).filter(lambda b: not _is_event(b)),
    st.sampled_from(
        [
            b"\xff\xfe{}",
            b'{"type": "order.created", "x": "\xff"}',
            b'{"type": "order.\xc3\x28"}',
            b'{"type": "\\ud800"}',
            b"null",
            b"[]",
            b'"order.created"',
            b"{}",
            b'{"type": null}',
            b'{"type": 1}',
            b'{"type": ""}',
            b'{"type": ["order.created"]}',
            b'{"type": {"name": "order.created"}}',
            b'{"type": "order.created"',
            b'{"type": "order.created"} trailing',
            b'{"type": "order.created", "n": 1e400}',
            b"[" * 2000 + b"]" * 2000,
            b'\xef\xbb\xbf{"type": "order.created"}',
            b"   ",
        ]
    ),
    st.one_of(JSON_SCALARS, st.lists(JSON_VALUES, max_size=4)).map(orjson.dumps),
)


def _is_event(body: bytes) -> bool:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(payload, dict) and isinstance(payload.get("type"), str) and payload["type"]


@dataclass(frozen=True)
class Plan:
    """One fuzzed delivery, before its fresh webhook-id is filled in."""

    id_value: bytes | None  # None: the fresh id the signatures are computed over
    ts_value: bytes | None  # None: a timestamp within the tolerance
    ts_offset: int
    body: bytes
    tamper_body: bool
    entries: tuple[tuple[str, bytes], ...]  # ("v1" | "v1a" | "rotated" | "stranger" | "raw", raw)
    separator: bytes
    counts: tuple[int, int, int]  # how often webhook-id, -timestamp, -signature are sent
    second_values_differ: bool
    extra: tuple[tuple[bytes, bytes], ...]
    extra_first: bool
    content_length: str | bytes | None  # "exact", "more", "less", raw bytes, or None
    split: tuple[int, ...]
    path: str
    method: str


MUTATIONS = (
    "id",
    "timestamp",
    "tamper_body",
    "entries",
    "separator",
    "counts",
    "content_length",
    "big_body",
    "route",
)
VALID_ENTRY = st.sampled_from(["v1", "v1a", "rotated"]).map(lambda kind: (kind, b""))
GARBAGE_ENTRY = st.one_of(st.just(("stranger", b"")), GARBAGE_ENTRIES.map(lambda raw: ("raw", raw)))


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    """A delivery that is correctly signed except for the mutations drawn (none a third of the
    time), so that both sides of the oracle are well explored."""
    mutations = draw(
        st.one_of(
            st.just(frozenset[str]()),
            st.frozensets(st.sampled_from(MUTATIONS), min_size=1, max_size=3),
        )
    )
    if "big_body" in mutations:
        body = draw(
            st.one_of(
                st.integers(SMALL_MAX - 30, SMALL_MAX + 2).map(
                    lambda n: b'{"type":"order.big","pad":"' + b"x" * n + b'"}'
                ),
                st.binary(min_size=SMALL_MAX - 1, max_size=SMALL_MAX + 64),
            )
        )
    else:
        body = draw(VALID_EVENTS if draw(st.booleans()) else INVALID_PAYLOADS)

    if "entries" in mutations:
        entries = draw(
            st.one_of(
                st.lists(GARBAGE_ENTRY, max_size=6),
                # Far past the entry limit, with or without a valid one among them.
                st.tuples(st.booleans(), st.integers(MAX_SIGNATURE_ENTRIES - 1, 1000)).map(
                    lambda t: [("v1", b"")] * t[0] + [("raw", b"v1,garbage")] * t[1]
                ),
            )
        )
    else:
        valid = draw(st.lists(VALID_ENTRY, min_size=1, max_size=3))
        garbage = draw(st.lists(GARBAGE_ENTRY, max_size=4))
        entries = draw(st.permutations(valid + garbage))

    if "counts" in mutations:
        counts = draw(
            st.tuples(*[st.sampled_from([0, 1, 1, 2, 3])] * 3).filter(lambda c: c != (1, 1, 1))
        )
    else:
        counts = (1, 1, 1)

    content_length: str | bytes | None = draw(
        st.sampled_from([None, "exact", "exact", "more", "less"])
    )
    if "content_length" in mutations:
        content_length = draw(
            st.one_of(
                st.sampled_from(
                    [b"abc", b"-1", b"", b" 10", b"1e3", b"0x10", b"\xb2", b"9" * 5000, b"0"]
                ),
                st.binary(max_size=12),
            )
        )
    path, method = f"/{PROVIDER}", "POST"
    if "route" in mutations:
        path, method = draw(
            st.one_of(
                st.tuples(st.sampled_from(["/unknown", "/", f"/{PROVIDER}/x"]), st.just("POST")),
                st.tuples(st.just(path), st.sampled_from(["GET", "PUT", "DELETE", "PATCH"])),
            )
        )
    return Plan(
        id_value=draw(GARBAGE_IDS) if "id" in mutations else None,
        ts_value=draw(GARBAGE_TIMESTAMPS) if "timestamp" in mutations else None,
        ts_offset=draw(st.integers(-TOLERANCE, TOLERANCE)),
        body=body,
        tamper_body="tamper_body" in mutations,
        entries=tuple(entries),
        separator=draw(SEPARATORS) if "separator" in mutations else b" ",
        counts=counts,
        second_values_differ=draw(st.booleans()),
        extra=tuple(draw(EXTRA_HEADERS)),
        extra_first=draw(st.booleans()),
        content_length=content_length,
        split=tuple(draw(st.lists(st.integers(0, len(body)), max_size=4).map(sorted))),
        path=path,
        method=method,
    )


def materialize(plan: Plan, webhook_id: str) -> tuple[Headers, list[bytes], bool | None]:
    """The raw request of a plan, and whether the receiver must accept it: True (it is
    correctly signed and within every limit), False (it must be refused), or None (the oracle
    does not decide, e.g. a 5000-digit Content-Length)."""
    timestamp = NOW + plan.ts_offset
    signed_body = plan.body
    sent_body = plan.body + b" " if plan.tamper_body else plan.body
    signers = {
        "v1": SECRET,
        "rotated": ROTATED,
        "v1a": PRIVATE_KEY,
        "stranger": STRANGER,
    }
    raw_entries = [
        raw if kind == "raw" else sign(signers[kind], webhook_id, timestamp, signed_body).encode()
        for kind, raw in plan.entries
    ]
    signature = plan.separator.join(raw_entries)
    id_value = webhook_id.encode() if plan.id_value is None else plan.id_value
    ts_value = str(timestamp).encode() if plan.ts_value is None else plan.ts_value

    headers: Headers = []
    for name, value, count in zip(
        (b"webhook-id", b"webhook-timestamp", b"webhook-signature"),
        (id_value, ts_value, signature),
        plan.counts,
        strict=True,
    ):
        for index in range(count):
            headers.append((name, value + b"2" if index and plan.second_values_differ else value))
    extra = list(plan.extra)
    headers = extra + headers if plan.extra_first else headers + extra
    declared: bytes | None = None
    if plan.content_length == "exact":
        declared = str(len(sent_body)).encode()
    elif plan.content_length == "more":
        declared = str(len(sent_body) + 100).encode()
    elif plan.content_length == "less":
        declared = str(max(0, len(sent_body) - 5)).encode()
    elif isinstance(plan.content_length, bytes):
        declared = plan.content_length
    if declared is not None:
        headers.append((b"content-length", declared))
    bounds = [0, *plan.split, len(sent_body)]
    chunks = [sent_body[a:b] for a, b in itertools.pairwise(bounds)]

    # The oracle. Exactly one of each webhook header, the fresh id, a timestamp in tolerance,
    # and one configured key's signature over exactly what is sent.
    signed_over_sent = (
        plan.id_value in (None, webhook_id.encode())
        and plan.ts_value in (None, str(timestamp).encode())
        and not plan.tamper_body
    )
    has_valid_entry = any(kind in ("v1", "v1a", "rotated") for kind, _ in plan.entries)
    correctly_signed = signed_over_sent and has_valid_entry and plan.counts == (1, 1, 1)
    if not correctly_signed or plan.path != f"/{PROVIDER}" or plan.method != "POST":
        return headers, chunks, False
    accept: bool | None = (
        len(signature) <= MAX_SIGNATURE_HEADER
        and len([e for e in signature.split(b" ") if e]) <= MAX_SIGNATURE_ENTRIES
        and len(sent_body) <= SMALL_MAX
    )
    if declared is not None:
        if len(declared) > 4000:
            accept = None  # past int()'s digit limit: refused, or accepted, either is sane
        elif re.fullmatch(rb"[0-9]+", declared) is None or int(declared) > SMALL_MAX:
            accept = False
    # The separator decides whether a valid entry stands alone; only " " is the list delimiter.
    if accept and plan.separator != b" " and len(plan.entries) > 1:
        accept = None
    # Svix's names for the same three fields: the same value again changes nothing, another
    # value (or a second svix- header) is refused, 400 duplicate_header.
    svix = {b"svix-id": id_value, b"svix-timestamp": ts_value, b"svix-signature": signature}
    named = [(name, value) for name, value in plan.extra if name in svix]
    if len({name for name, _ in named}) < len(named) or any(v != svix[n] for n, v in named):
        accept = False
    return headers, chunks, accept


# -- T6: the fuzzers ---------------------------------------------------------------------------


@FUZZ
@given(plan=plans())
def test_fuzzed_delivery_never_5xx_and_unsigned_never_stored(harness: Harness, plan: Plan) -> None:
    webhook_id = harness.fresh_id()
    headers, chunks, accept = materialize(plan, webhook_id)
    before = harness.mark()
    answer = harness.post(headers, chunks, path=plan.path, method=plan.method)
    event(f"oracle: {accept}, answer: {answer.status}")
    if accept is False:
        check_refused(harness, before, answer)
    elif accept is True:
        check_accepted(harness, before, webhook_id, answer)
    else:
        check_answer(answer)
        if harness.rows() != before:
            check_accepted(harness, before, webhook_id, answer)


@FUZZ
@given(
    headers=st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(
                    [b"webhook-id", b"webhook-timestamp", b"webhook-signature", b"content-length"]
                ),
                st.binary(max_size=20),
            ),
            st.one_of(
                st.binary(max_size=100),
                st.builds(
                    bytes.__mul__, st.binary(min_size=1, max_size=3), st.integers(2000, 40000)
                ),
            ),
        ),
        max_size=10,
    ),
    chunks=st.lists(st.binary(max_size=600), max_size=5),
)
def test_arbitrary_header_lists_and_bodies(
    harness: Harness, headers: Headers, chunks: list[bytes]
) -> None:
    before = harness.mark()
    answer = harness.post(headers, chunks)
    check_refused(harness, before, answer)


@FUZZ
@given(body=VALID_EVENTS, key=st.sampled_from([SECRET, ROTATED, PRIVATE_KEY]))
@example(body=body_of("order.created", order="o-1"), key=SECRET)
@example(body=orjson.dumps({"type": "\u00e9v\u00e9nement", "data": "\U0001f600"}), key=SECRET)
@example(body=orjson.dumps({"type": "order.created", "data": "\u0000"}), key=PRIVATE_KEY)
def test_correctly_signed_events_are_answered_200_and_recorded(
    harness: Harness, body: bytes, key: str
) -> None:
    webhook_id = harness.fresh_id()
    signature = sign(key, webhook_id, NOW, body)
    before = harness.mark()
    answer = harness.post(webhook_headers(webhook_id, str(NOW), signature), [body])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 200, answer


@pytest.mark.parametrize(
    "event_type",
    ["\x00", "order.\x00", "order.created\x00x", "order\ncreated", "\x7f", "x" * 256],
)
def test_a_signed_event_type_with_control_characters_is_a_recorded_400(
    harness: Harness, event_type: str
) -> None:
    """An event type is a routing key and a stored column: 1-255 characters, no control
    characters (PostgreSQL text cannot even hold U+0000, which JSON can carry as "\\u0000").
    A correctly signed event with such a type is an invalid payload: 400, recorded as final."""
    body = orjson.dumps({"type": event_type, "data": {}})
    webhook_id = harness.fresh_id()
    before = harness.mark()
    answer = harness.post(signed_headers(webhook_id, body), [body])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 400, answer


@FUZZ
@given(body=INVALID_PAYLOADS, garbage=st.lists(GARBAGE_ENTRIES, max_size=3))
@example(body=b"", garbage=[])
@example(body=b"\xff\xfe\x00\x01", garbage=[])
@example(body=b"not json", garbage=[b"v1,", b"v1a,xyz"])
@example(body=b'{"data": {}}', garbage=[])
@example(body=b'{"type": 42}', garbage=[])
def test_correctly_signed_invalid_payloads_are_400_and_final(
    harness: Harness, body: bytes, garbage: list[bytes]
) -> None:
    """Verified, but not JSON with a string "type": 400, recorded as final, replayed after."""
    webhook_id = harness.fresh_id()
    entries = [*garbage, sign(SECRET, webhook_id, NOW, body).encode()]
    headers = webhook_headers(webhook_id, str(NOW), b" ".join(entries))
    before = harness.mark()
    answer = harness.post(headers, [body])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 400, answer
    again = harness.post(headers, [body])
    assert (again.status, again.body) == (answer.status, answer.body)
    assert again.headers.get(b"idempotent-replayed") == b"true"
    assert harness.rows() == before + 1
    assert webhook_id not in harness.handled


# -- targeted cases --------------------------------------------------------------------------


def refused(harness: Harness, headers: Headers, body: bytes, **options: Any) -> Answer:
    before = harness.mark()
    answer = harness.post(headers, [body], **options)
    check_refused(harness, before, answer)
    return answer


@pytest.mark.parametrize(
    "timestamp",
    ["1e9", "-5", " 123", "0x10", "123.0", "", "+1800000000", "01800000000", "1800000000 "],
)
def test_malformed_timestamps_are_400(harness: Harness, timestamp: str) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    # Signed over the malformed text itself, so only the timestamp check can refuse it.
    content = f"{webhook_id}.{timestamp}.".encode() + body
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signature = "v1," + base64.b64encode(hmac.digest(key, content, hashlib.sha256)).decode()
    answer = refused(harness, webhook_headers(webhook_id, timestamp, signature), body)
    assert answer.status in (400, 401), answer


@pytest.mark.parametrize("offset", [-TOLERANCE - 1, TOLERANCE + 1, -(10**9), 10**11])
def test_timestamps_outside_the_tolerance_are_401(harness: Harness, offset: int) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    answer = refused(harness, signed_headers(webhook_id, body, NOW + offset), body)
    assert (answer.status, answer.error()) == (401, "timestamp")


@pytest.mark.parametrize(
    "webhook_id",
    ["x" * 256, "x" * 300, "msg.1", "msg\x00id", "msg id", "", "m\u00e9sg", "msg\t1"],
)
def test_malformed_webhook_ids_are_refused_even_when_signed(
    harness: Harness, webhook_id: str
) -> None:
    body = body_of()
    signature = sign(SECRET, webhook_id, NOW, body)
    answer = refused(harness, webhook_headers(webhook_id, str(NOW), signature), body)
    assert answer.status == 400, answer


def test_a_255_char_webhook_id_is_the_longest_accepted(harness: Harness) -> None:
    body = body_of()
    webhook_id = "x" * 255
    before = harness.mark()
    answer = harness.post(signed_headers(webhook_id, body), [body])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 200


@pytest.mark.parametrize("name", [b"webhook-id", b"webhook-timestamp", b"webhook-signature"])
@pytest.mark.parametrize("same", [True, False], ids=["same-value", "other-value"])
def test_duplicated_webhook_headers_are_400(harness: Harness, name: bytes, same: bool) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    headers = signed_headers(webhook_id, body)
    original = dict(headers)[name]
    headers.append((name, original if same else original + b"x"))
    answer = refused(harness, headers, body)
    assert (answer.status, answer.error()) == (400, f"duplicate_header:{name.decode()}")


def test_two_signature_headers_each_valid_are_400(harness: Harness) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    headers = signed_headers(webhook_id, body)
    headers.append((b"webhook-signature", sign(ROTATED, webhook_id, NOW, body).encode()))
    assert refused(harness, headers, body).status == 400


@pytest.mark.parametrize("missing", [b"webhook-id", b"webhook-timestamp", b"webhook-signature"])
def test_missing_or_empty_webhook_headers_are_400(harness: Harness, missing: bytes) -> None:
    body = body_of()
    headers = signed_headers(harness.fresh_id(), body)
    without = [h for h in headers if h[0] != missing]
    assert refused(harness, without, body).status == 400
    emptied = [(n, b"" if n == missing else v) for n, v in headers]
    assert refused(harness, emptied, body).status == 400


def garbage_signatures(body: bytes, webhook_id: str) -> list[str]:
    valid = sign(SECRET, webhook_id, NOW, body)
    b64 = valid.removeprefix("v1,")
    return [
        "v1,",
        "v1,!!!!" + b64[4:],
        "v1," + b64[:-2],  # bad padding
        "v1," + b64 + "AAAA",
        "v1a," + b64,
        "v1a," + b64 + b64,
        "v1a,",
        ",",
        ",,,",
        " ",
        "v1",
        "v1;" + b64,
        "v1, " + b64,
        "V1," + b64,
        "v2," + b64,
        valid.replace("v1,", "v1a,"),
        valid.upper(),
        b64,
        "v1," + base64.urlsafe_b64encode(base64.b64decode(b64)).decode(),
        " ".join(["v1,x"] * 1000),
        " ".join(["v1," + b64[:-4] + "AAA="] * 33),
        "v1," + "A" * 10000,
        "\x00",
        "v1,\xff" + b64[1:],
    ]


@pytest.mark.parametrize("index", range(24))
def test_only_garbage_signatures_are_refused(harness: Harness, index: int) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    signature = garbage_signatures(body, webhook_id)[index]
    answer = refused(harness, webhook_headers(webhook_id, str(NOW), signature), body)
    assert answer.status in (400, 401), answer


@pytest.mark.parametrize(
    ("arrange", "accepted"),
    [
        (lambda valid, junk: [valid, *junk[:5]], True),
        (lambda valid, junk: [*junk[:5], valid], True),
        (lambda valid, junk: [junk[0], valid, junk[6]], True),
        (lambda valid, junk: ["v1a,AAAA", "v9,zzz", valid], True),
        (lambda valid, junk: [valid + ","], False),
        (lambda valid, junk: ["," + valid], False),
        (lambda valid, junk: [valid, *(["v1,x"] * 1000)], False),
        (lambda valid, junk: [*(["v1,x"] * 1000), valid], False),
    ],
    ids=[
        "valid-first",
        "valid-last",
        "valid-middle",
        "unknown-versions",
        "trailing-comma",
        "leading-comma",
        "valid-then-1000",
        "1000-then-valid",
    ],
)
def test_a_valid_signature_among_garbage(harness: Harness, arrange: Any, accepted: bool) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    valid = sign(SECRET, webhook_id, NOW, body)
    junk = [s for s in garbage_signatures(body, webhook_id) if s.strip() and len(s) < 200]
    signature = " ".join(arrange(valid, junk))
    headers = webhook_headers(webhook_id, str(NOW), signature)
    if accepted:
        before = harness.mark()
        answer = harness.post(headers, [body])
        check_accepted(harness, before, webhook_id, answer)
        assert answer.status == 200
    else:
        refused(harness, headers, body)


@pytest.mark.parametrize(
    "declared",
    [b"abc", b"-1", b"", b" 5", b"5 ", b"1e3", b"0x10", b"\xb2", b"\xd9\xa1", b"9" * 5000, b"+5"],
)
def test_non_numeric_content_length_is_refused_before_the_store(
    harness: Harness, declared: bytes
) -> None:
    body = body_of()
    headers = [*signed_headers(harness.fresh_id(), body), (b"content-length", declared)]
    answer = refused(harness, headers, body)
    assert answer.status in (400, 413), answer


@pytest.mark.parametrize("declared", ["more", "less", "zero"])
def test_a_lying_numeric_content_length_is_harmless(harness: Harness, declared: str) -> None:
    """The body that arrives is what gets verified; the header only gates the size early."""
    body = body_of()
    webhook_id = harness.fresh_id()
    length = {"more": len(body) + 100, "less": len(body) // 2, "zero": 0}[declared]
    headers = [*signed_headers(webhook_id, body), (b"content-length", str(length).encode())]
    before = harness.mark()
    answer = harness.post(headers, [body[:10], body[10:20], body[20:]])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 200


def test_a_declared_size_over_the_limit_is_413_without_reading(harness: Harness) -> None:
    body = body_of()
    headers = [*signed_headers(harness.fresh_id(), body), (b"content-length", b"99999999999")]
    answer = refused(harness, headers, body)
    assert (answer.status, answer.error()) == (413, "body_too_large")


def test_two_content_length_headers(harness: Harness) -> None:
    body = body_of()
    headers = [
        *signed_headers(harness.fresh_id(), body),
        (b"content-length", str(len(body)).encode()),
        (b"content-length", b"abc"),
    ]
    answer = harness.post(headers, [body])
    check_answer(answer)


@pytest.mark.parametrize("declare", [True, False], ids=["declared", "chunked"])
@pytest.mark.parametrize("extra", [1, SMALL_MAX])
def test_bodies_over_a_small_limit_are_413(harness: Harness, declare: bool, extra: int) -> None:
    body = b'{"type":"order.big","pad":"' + b"x" * (SMALL_MAX + extra) + b'"}'
    headers = signed_headers(harness.fresh_id(), body)
    if declare:
        headers.append((b"content-length", str(len(body)).encode()))
    chunks = [body[i : i + 500] for i in range(0, len(body), 500)]
    before = harness.mark()
    answer = harness.post(headers, chunks)
    check_refused(harness, before, answer)
    assert (answer.status, answer.error()) == (413, "body_too_large")


@pytest.mark.parametrize("declare", [True, False], ids=["declared", "chunked"])
def test_bodies_over_the_default_1mib_are_413(default_harness: Harness, declare: bool) -> None:
    harness = default_harness
    body = b'{"type":"order.big","pad":"' + b"x" * DEFAULT_MAX + b'"}'
    headers = signed_headers(harness.fresh_id(), body)
    if declare:
        headers.append((b"content-length", str(len(body)).encode()))
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    before = harness.mark()
    answer = harness.post(headers, chunks)
    check_refused(harness, before, answer)
    assert answer.status == 413


def test_a_body_of_exactly_the_default_limit_is_accepted(default_harness: Harness) -> None:
    harness = default_harness
    head, tail = b'{"type":"order.big","pad":"', b'"}'
    body = head + b"x" * (DEFAULT_MAX - len(head) - len(tail)) + tail
    webhook_id = harness.fresh_id()
    headers = [*signed_headers(webhook_id, body), (b"content-length", str(len(body)).encode())]
    before = harness.mark()
    answer = harness.post(headers, [body[:300_000], body[300_000:]])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 200


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe\xfd", b'{"type":"order.created","x":"\xc3\x28"}', b"\x00" * 10],
    ids=["binary", "invalid-utf8-in-json", "nul-bytes"],
)
def test_a_correctly_signed_non_utf8_body_is_400_and_final(harness: Harness, body: bytes) -> None:
    webhook_id = harness.fresh_id()
    before = harness.mark()
    answer = harness.post(signed_headers(webhook_id, body), [body])
    check_accepted(harness, before, webhook_id, answer)
    assert answer.status == 400


def test_a_non_utf8_body_that_is_not_correctly_signed_is_refused(harness: Harness) -> None:
    body = b"\xff\xfe\xfd"
    webhook_id = harness.fresh_id()
    headers = webhook_headers(webhook_id, str(NOW), sign(SECRET, webhook_id, NOW, b"other"))
    assert refused(harness, headers, body).status == 401


def test_the_signature_of_another_id_or_secret_is_refused(harness: Harness) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    other = sign(SECRET, "msg_other", NOW, body)
    assert refused(harness, webhook_headers(webhook_id, str(NOW), other), body).status == 401
    stranger = sign(STRANGER, webhook_id, NOW, body)
    assert refused(harness, webhook_headers(webhook_id, str(NOW), stranger), body).status == 401
    # The timestamp is part of what is signed: another one cannot re-use the signature.
    later = sign(SECRET, webhook_id, NOW, body)
    assert refused(harness, webhook_headers(webhook_id, str(NOW + 1), later), body).status == 401


def test_huge_header_values(harness: Harness) -> None:
    body = body_of()
    webhook_id = harness.fresh_id()
    big = b"v1," + b"A" * 1_000_000
    for headers in (
        webhook_headers(webhook_id, str(NOW), big),
        webhook_headers(b"x" * 1_000_000, str(NOW), "v1,x"),
        webhook_headers(webhook_id, b"1" * 1_000_000, "v1,x"),
        [*signed_headers(webhook_id, body), (b"x-padding", b"\xff" * 1_000_000)],
    ):
        answer = harness.post(headers, [body])
        check_answer(answer)
    # The last one was correctly signed: an unrelated huge header does not stop it.
    assert harness.state(webhook_id) == "completed"


def test_unknown_provider_and_wrong_method_are_json_4xx(harness: Harness) -> None:
    body = body_of()
    headers = signed_headers(harness.fresh_id(), body)
    for path, method, status in [
        ("/unknown", "POST", 404),
        ("/unknown", "GET", 404),
        ("/unknown", "DELETE", 404),
        ("/", "POST", 404),
        (f"/{PROVIDER}/extra", "POST", 404),
        (f"/{PROVIDER}", "GET", 405),
        (f"/{PROVIDER}", "PUT", 405),
    ]:
        answer = refused(harness, headers, body, path=path, method=method)
        assert answer.status == status, (path, method, answer)


def test_a_client_that_disconnects_mid_body_is_not_an_unhandled_exception(
    harness: Harness,
) -> None:
    """The sender hung up before the whole body arrived: there is nobody to answer, but the app
    must neither raise nor touch the store."""
    body = body_of()
    headers = signed_headers(harness.fresh_id(), body)
    before = harness.mark()
    sent = harness.send_raw(headers, [body[:10], body[10:]], disconnect_after=1)
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert all(status < 500 for status in statuses), sent
    assert harness.rows() == before
