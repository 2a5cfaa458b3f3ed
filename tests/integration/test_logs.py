"""Structured logs: one JSON object per decision, with the fields a person needs to find the
delivery (provider, webhook-id, type, outcome, status, fence, duration, the gateway's request
id), and never a secret, a signature or a body."""

from __future__ import annotations

import base64
import contextlib
import io
import logging
import logging.config
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

from receiver import Connection, Event, JSONFormatter, Provider, Receiver, Store
from receiver._cli.main import build_parser
from receiver._logging import TextFormatter, logging_config
from tests.support import PROVIDER, SECRET, Clock, body_of, make_receiver, signed

BODY_MARKER = "body-text-that-must-never-be-logged"
FORGED_SECRET = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-long!").decode()


@contextlib.contextmanager
def captured(formatter: logging.Formatter) -> Iterator[io.StringIO]:
    """Every record of the ``receiver`` loggers, formatted, one per line."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    log = logging.getLogger("receiver")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield out
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


async def run_deliveries(store: Store) -> list[dict[str, str]]:
    """A run with an execution, a replay, a forged signature, a handler that raises, a
    mismatch and a body over the limit. Returns the headers sent (signatures included)."""
    clock = Clock()
    rx, _ = make_receiver(store, clock=clock, max_body_size=5000)
    sent: list[tuple[str, bytes, dict[str, str]]] = []
    ok = body_of(order="o-1", note=BODY_MARKER)
    forged = signed("msg_forged", ok, timestamp=clock.now, secret=FORGED_SECRET)
    sent.append(("msg_1", ok, signed("msg_1", ok, timestamp=clock.now)))
    sent.append(("msg_1", ok, signed("msg_1", ok, timestamp=clock.now)))
    sent.append(("msg_forged", ok, forged))
    failing = body_of(mode="raise", note=BODY_MARKER)
    sent.append(("msg_2", failing, signed("msg_2", failing, timestamp=clock.now)))
    other = body_of(order="o-2", note=BODY_MARKER)
    sent.append(("msg_1", other, signed("msg_1", other, timestamp=clock.now)))
    huge = body_of(pad=BODY_MARKER * 200)
    sent.append(("msg_3", huge, signed("msg_3", huge, timestamp=clock.now)))
    await rx.open()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=rx), base_url="http://test"
        ) as client:
            for i, (_, body, headers) in enumerate(sent):
                await client.post(
                    f"/{PROVIDER}",
                    content=body,
                    headers={**headers, "x-kong-request-id": f"kong-{i}"},
                )
    finally:
        await rx.close()
    return [headers for _, _, headers in sent]


async def test_one_json_object_per_decision(store: Store) -> None:
    with captured(JSONFormatter()) as out:
        await run_deliveries(store)
    records = [orjson.loads(line) for line in out.getvalue().splitlines()]
    decisions = [r for r in records if r["message"].startswith("delivery ")]
    assert [(d["webhook_id"], d["outcome"], d["status"]) for d in decisions] == [
        ("msg_1", "executed", 200),
        ("msg_1", "replayed", 200),
        (None, "rejected", 401),
        ("msg_2", "handler_failed", 500),
        ("msg_1", "payload_mismatch", 422),
        (None, "rejected", 413),
    ]
    for i, d in enumerate(decisions):
        assert d["level"] == "info"
        assert d["logger"] == "receiver"
        assert d["provider"] == PROVIDER
        assert d["request_id"] == f"kong-{i}"
        assert isinstance(d["duration_ms"], float)
        assert d["time"].endswith("+00:00")
        assert {"event_type", "fence", "check"} <= set(d)
    assert decisions[0]["event_type"] == "order.created"
    assert decisions[0]["fence"] == 1
    assert decisions[3]["fence"] == 1
    assert decisions[2]["check"] == "signature"
    assert decisions[5]["check"] == "body_too_large"
    assert decisions[0]["check"] is None
    # The handler's failure is logged with its traceback, as structured fields.
    (failure,) = [r for r in records if r["message"].startswith("handler failed")]
    assert failure["level"] == "error"
    assert failure["webhook_id"] == "msg_2"
    assert failure["exc_type"] == "RuntimeError"
    assert "the handler failed on purpose" in failure["exc"]
    (mismatch,) = [r for r in records if "payload mismatch" in r["message"]]
    assert mismatch["level"] == "warning"


async def test_no_secret_signature_or_body_is_logged(store: Store) -> None:
    with captured(JSONFormatter()) as json_out, captured(TextFormatter()) as text_out:
        sent = await run_deliveries(store)
    logged = json_out.getvalue() + text_out.getvalue()
    assert logged.count("\n") >= 12
    forbidden = [SECRET, SECRET.removeprefix("whsec_"), FORGED_SECRET, BODY_MARKER]
    for headers in sent:
        signature = headers["webhook-signature"]
        forbidden += [signature, signature.split(",", 1)[1]]
    for text in forbidden:
        assert text not in logged, text


#: A handler's error that quotes what it was given, in the forms exception text takes.
LEAKY_ERROR = (
    "login to https://shop:pa55w0rd@bank.example failed: password=hunter2, pw: opensesame, "
    "pass=letmein; securityCode=737 {'apiKey': 'ak-123', 'passenger': 'Ann Lee'} "
    "Authorization: Basic dXNlcjpwYXNz compass=north"
)
LEAKED = ("pa55w0rd", "hunter2", "opensesame", "letmein", "737", "ak-123", "dXNlcjpwYXNz")


async def test_secrets_in_a_handlers_error_are_masked_where_it_is_stored_and_logged(
    store: Store,
) -> None:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        raise ValueError(LEAKY_ERROR)

    body = body_of(order="o-1")
    with captured(JSONFormatter()) as json_out, captured(TextFormatter()) as text_out:
        async with rx:
            answer = await rx.deliver(PROVIDER, signed("msg_leak", body), body)
    assert answer.status_code == 500
    async with store.acquire() as conn:
        stored = [
            await conn.fetchval("SELECT last_error FROM receiver_receipts"),
            *[row["error"] for row in await conn.fetch("SELECT error FROM receiver_attempts")],
        ]
    assert len(stored) == 2
    (failure,) = [
        orjson.loads(line) for line in json_out.getvalue().splitlines() if "handler failed" in line
    ]
    text = text_out.getvalue()
    assert "handler failed" in text
    for shown in (*stored, failure["exc"], text):
        for secret in LEAKED:
            assert secret not in shown, (secret, shown)
        # What is not a secret stays readable: the words, the names, the host.
        for kept in ("login to", "bank.example", "password=•••", "passenger", "Ann Lee"):
            assert kept in shown, (kept, shown)
        assert "compass=north" in shown
    assert stored[0].startswith("ValueError: login to https://shop:•••@bank.example failed")


def test_text_format_puts_the_fields_after_the_message() -> None:
    record = logging.makeLogRecord(
        {
            "name": "receiver",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "delivery %s",
            "args": ("executed",),
            "provider": "acme",
            "webhook_id": "msg_1",
            "fence": None,
        }
    )
    line = TextFormatter().format(record)
    assert line.endswith("INFO receiver: delivery executed provider=acme webhook_id=msg_1")


def test_values_json_cannot_encode_are_still_one_line() -> None:
    record = logging.makeLogRecord(
        {"msg": "odd", "big": 2**80, "obj": object(), "text": "a\nb\x00"}
    )
    line = JSONFormatter().format(record)
    assert "\n" not in line
    parsed: dict[str, Any] = orjson.loads(line)
    assert parsed["big"] == 2**80
    assert parsed["text"] == "a\nb\x00"


def test_serve_log_format_option() -> None:
    parser = build_parser()
    for command in ("serve", "worker", "proxy", "console"):
        assert parser.parse_args([command]).log_format == "auto"
    assert parser.parse_args(["serve", "--log-format", "text"]).log_format == "text"
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        for fmt, formatter in (("json", JSONFormatter), ("text", TextFormatter)):
            logging.config.dictConfig(logging_config(fmt, "warning"))
            (handler,) = root.handlers
            assert isinstance(handler.formatter, formatter)
            assert root.level == logging.WARNING
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
