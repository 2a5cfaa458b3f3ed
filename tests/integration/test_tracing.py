"""OpenTelemetry spans, seen through the SDK's in-memory exporter: one span per delivery with
its provider, webhook-id, outcome and fence, the handlers as children, the gateway's W3C
``traceparent`` continued, error status on failure, and nothing secret in any attribute."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from receiver import Event, Receiver, Store
from receiver._store.base import Connection
from tests.servers import ROOT
from tests.support import PROVIDER, SECRET, Clock, body_of, make_receiver, signed

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
MARKER = "payload-value-that-must-never-be-traced"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def traced(store: Store, exporter: InMemorySpanExporter, **options: Any) -> Receiver:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rx, _ = make_receiver(store, clock=Clock(), tracer_provider=provider, **options)
    return rx


async def post(rx: Receiver, webhook_id: str, body: bytes, **extra: str) -> httpx.Response:
    headers = {**signed(webhook_id, body, timestamp=rx.clock()), **extra}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=rx), base_url="http://test"
    ) as client:
        return await client.post(f"/{PROVIDER}", content=body, headers=headers)


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_one_span_per_delivery_continuing_the_gateways_trace(
    store: Store, exporter: InMemorySpanExporter
) -> None:
    rx = traced(store, exporter)
    async with rx:
        body = body_of(order="o-1", note=MARKER)
        first = await post(rx, "msg_1", body, traceparent=TRACEPARENT)
        second = await post(rx, "msg_1", body)
    assert first.status_code == second.status_code == 200
    spans = exporter.get_finished_spans()
    deliveries = by_name(spans, "webhook ")
    assert [s.name for s in deliveries] == [f"webhook {PROVIDER}"] * 2
    executed, replayed = deliveries
    assert executed.kind is SpanKind.SERVER
    assert executed.attributes is not None
    assert dict(executed.attributes) == {
        "webhook.provider": PROVIDER,
        "webhook.id": "msg_1",
        "webhook.event_type": "order.created",
        "webhook.outcome": "executed",
        "webhook.fence": 1,
        "http.response.status_code": 200,
    }
    # The gateway's trace goes on: same trace id, the gateway's span as the parent.
    assert format(executed.context.trace_id, "032x") == TRACE_ID
    assert executed.parent is not None
    assert format(executed.parent.span_id, "016x") == PARENT_ID
    assert executed.parent.is_remote
    # Without a traceparent, a new trace; the replay is its own delivery.
    assert replayed.parent is None
    assert replayed.attributes is not None
    assert replayed.attributes["webhook.outcome"] == "replayed"
    assert format(replayed.context.trace_id, "032x") != TRACE_ID
    assert executed.status.status_code is StatusCode.UNSET


async def test_handlers_are_child_spans(store: Store, exporter: InMemorySpanExporter) -> None:
    rx = traced(store, exporter)

    @rx.on("order.created")
    async def second_handler(event: Event, tx: Connection) -> None:
        pass

    async with rx:
        await post(rx, "msg_1", body_of(order="o-1"), traceparent=TRACEPARENT)
    spans = exporter.get_finished_spans()
    (delivery,) = by_name(spans, "webhook ")
    handlers = by_name(spans, "handler ")
    # Exact types first, then the "order.*" prefix of make_receiver's handler.
    assert [s.name.split(".")[-1] for s in handlers] == ["second_handler", "record"]
    for span in handlers:
        assert span.parent is not None
        assert span.parent.span_id == delivery.context.span_id
        assert span.context.trace_id == delivery.context.trace_id
        assert span.attributes is not None
        assert span.attributes["webhook.id"] == "msg_1"
        assert span.attributes["webhook.fence"] == 1
        assert span.status.status_code is StatusCode.UNSET


async def test_a_failing_handler_marks_both_spans_as_errors(
    store: Store, exporter: InMemorySpanExporter
) -> None:
    rx = traced(store, exporter)
    async with rx:
        response = await post(rx, "msg_1", body_of(mode="raise"))
    assert response.status_code == 500
    spans = exporter.get_finished_spans()
    (delivery,) = by_name(spans, "webhook ")
    (handler,) = by_name(spans, "handler ")
    assert handler.status.status_code is StatusCode.ERROR
    assert [e.name for e in handler.events] == ["exception"]
    assert handler.events[0].attributes is not None
    assert handler.events[0].attributes["exception.type"] == "RuntimeError"
    assert delivery.status.status_code is StatusCode.ERROR
    assert delivery.attributes is not None
    assert delivery.attributes["webhook.outcome"] == "handler_failed"
    assert delivery.attributes["http.response.status_code"] == 500


async def test_a_forged_delivery_names_the_check_but_no_id(
    sqlite_store: Store, exporter: InMemorySpanExporter
) -> None:
    rx = traced(sqlite_store, exporter)
    body = body_of(order="o-1")
    headers = signed("msg_forged", body, timestamp=rx.clock())
    headers["webhook-signature"] = "v1," + "A" * 44
    async with rx:
        response = await rx.deliver(PROVIDER, headers, body)
    assert response.status_code == 401
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["webhook.outcome"] == "rejected"
    assert span.attributes["webhook.rejected_check"] == "signature"
    assert "webhook.id" not in span.attributes  # unverified: not ours to name


_ids = itertools.count()
_ASCII = st.characters(min_codepoint=32, max_codepoint=126)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    values=st.lists(st.text(_ASCII, max_size=12), max_size=3),
    traceparent=st.one_of(st.none(), st.text(_ASCII, max_size=60), st.just(TRACEPARENT)),
)
async def test_no_secret_signature_or_payload_value_in_any_attribute(
    sqlite_store: Store, values: list[str], traceparent: str | None
) -> None:
    exporter = InMemorySpanExporter()
    rx = traced(sqlite_store, exporter)
    # Every payload value carries a tag that no attribute may show.
    body = body_of(order=f"{MARKER}-o", **{f"k{i}": f"{MARKER}-{v}" for i, v in enumerate(values)})
    headers = signed(f"msg_{next(_ids)}", body, timestamp=rx.clock())
    if traceparent is not None:
        headers["traceparent"] = traceparent
    async with rx:
        response = await rx.deliver(PROVIDER, headers, body)
    assert response.status_code == 200
    forbidden = (SECRET, SECRET.removeprefix("whsec_"), headers["webhook-signature"], MARKER)
    spans = exporter.get_finished_spans()
    assert len(spans) == 2  # the delivery and its handler
    for span in spans:
        for value in (span.attributes or {}).values():
            assert not any(f in str(value) for f in forbidden), (span.name, value)


async def test_without_an_sdk_no_span_is_made(sqlite_store: Store) -> None:
    """The API alone is a no-op: the Receiver finds no tracer, so the pipeline runs as is."""
    rx, _ = make_receiver(sqlite_store, clock=Clock())
    assert rx.tracing.tracer() is None
    async with rx:
        response = await post(rx, "msg_1", body_of(order="o-1"), traceparent=TRACEPARENT)
    assert response.status_code == 200


GLOBAL_SDK = """
import asyncio, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from receiver import SQLiteStore
from tests.support import PROVIDER, body_of, make_receiver, signed

async def main():
    rx, _ = make_receiver(SQLiteStore({path!r}))
    async with rx:
        body = body_of(order="o-1")
        await rx.deliver(PROVIDER, signed("msg_before", body), body)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)   # after the Receiver was built and used
        time.sleep(1.1)
        await rx.deliver(PROVIDER, signed("msg_after", body), body)
    print(sorted(str(dict(s.attributes)["webhook.id"]) for s in exporter.get_finished_spans()
                 if s.name.startswith("webhook ")))

asyncio.run(main())
"""


def test_a_global_sdk_installed_later_is_picked_up(tmp_path: Path) -> None:
    """The usual setup: the application sets the global provider (here after the Receiver was
    built, in a process of its own: the global provider can be set only once)."""
    script = GLOBAL_SDK.format(path=str(tmp_path / "r.db"))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['msg_after']"


async def test_a_driver_error_in_a_handler_leaves_no_payload_value_in_any_span(
    store: Store, exporter: InMemorySpanExporter
) -> None:
    """Issue 19 item 5: OpenTelemetry's own exception recording would put the driver's
    ``Key (email)=(...) already exists`` in the span's event, stack trace and status."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rx = Receiver(store, [make_receiver(store)[0].providers[PROVIDER]], tracer_provider=provider)

    @rx.on("signup")
    async def signup(event: Event, tx: Connection) -> None:
        await tx.execute("CREATE TABLE IF NOT EXISTS people (email TEXT PRIMARY KEY)")
        for _ in range(2):
            await tx.execute("INSERT INTO people (email) VALUES ($1)", event.payload["email"])

    async with rx:
        body = body_of("signup")[:-1] + f',"email":"{MARKER}"}}'.encode()
        answer = await post(rx, "msg_dup", body)
    assert answer.status_code == 500
    spans = exporter.get_finished_spans()
    (handler,) = by_name(spans, "handler ")
    assert handler.status.status_code is StatusCode.ERROR
    (event,) = handler.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert "Error" in str(event.attributes["exception.type"])
    texts = [str(handler.status.description)]
    for span in spans:
        texts += [str(v) for v in (span.attributes or {}).values()]
        for e in span.events:
            texts += [str(v) for v in (e.attributes or {}).values()]
    assert not any(MARKER in text for text in texts), texts
