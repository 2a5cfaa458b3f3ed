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

from receiver import JSONFormatter, Store
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
    assert parser.parse_args(["serve"]).log_format == "json"
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
