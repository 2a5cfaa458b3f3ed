"""Optional OpenTelemetry tracing: one span per delivery, one child span per handler.

Only the API package (``opentelemetry-api``) is a dependency. Until the application installs an
SDK (``opentelemetry.trace.set_tracer_provider(TracerProvider(...))``) or hands the Receiver a
``tracer_provider``, the API's provider is a no-op proxy: then a delivery costs a clock read
here, two context-variable reads in the pipeline, and no span object is ever made
(``python -m benchmarks.tracing`` measures it).

The delivery span continues the gateway's trace: Kong and most proxies send W3C
``traceparent`` (and ``tracestate``), extracted with the globally configured propagator (W3C
trace context and baggage by default). Its attributes are the provider, the webhook-id, the
event type, the outcome, the fence and the HTTP status: never a secret, a signature, a header
value or anything from the payload beyond its ``type``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider

from .._ops.redact import describe, stack

if TYPE_CHECKING:
    from .events import Event
    from .handlers import Handler

_SCOPE = "receiver"
_NO_OP = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)

# The tracer of the delivery being processed in this task, for its handlers' child spans; None
# when tracing is off (or outside a delivery: the sweeper's and an operator's replays).
_current: ContextVar[Tracer | None] = ContextVar("receiver_tracer", default=None)

# Reusable: a fresh nullcontext per handler call costs twice as much.
_UNTRACED = contextlib.nullcontext()

# Outcomes that mean the delivery did not succeed on our side (the sender retries them).
_ERRORS = frozenset({"handler_failed", "store_unavailable"})


class Tracing:
    """Where a Receiver's spans go: ``provider``, or the global provider when None."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer: tuple[TracerProvider, Tracer] | None = None
        # When the global provider was last seen to be the no-op one (see tracer()).
        self._idle_until = 0.0

    def tracer(self) -> Tracer | None:
        """The tracer to use now, or None while no SDK is configured.

        The global provider is looked up again at most once a second while it is the no-op
        one: an application may install its SDK after building the Receiver, and the lookup
        (an environment variable check in the API) costs more than the rest of this hook.
        """
        provider = self._provider
        if provider is None:
            now = time.monotonic()
            if now < self._idle_until:
                return None
            provider = trace.get_tracer_provider()
            if isinstance(provider, _NO_OP):
                self._idle_until = now + 1.0
                return None
        if self._tracer is None or self._tracer[0] is not provider:
            self._tracer = (provider, provider.get_tracer(_SCOPE))
        return self._tracer[1]

    @contextlib.contextmanager
    def delivery(
        self, tracer: Tracer, provider: str, headers: Mapping[str, str]
    ) -> Iterator[DeliverySpan]:
        """The span of one delivery, current while the pipeline runs: ``finish()`` it with the
        answer."""
        parent = propagate.extract(headers)
        with tracer.start_as_current_span(
            f"webhook {provider}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"webhook.provider": provider},
            record_exception=False,  # recorded redacted, as in _handler_span
            set_status_on_exception=False,
        ) as span:
            token = _current.set(tracer)
            try:
                yield DeliverySpan(span)
            except BaseException as exc:
                record_failure(span, exc)
                raise
            finally:
                _current.reset(token)


def annotate(webhook_id: str | None, event_type: str | None) -> None:
    """Name the delivery's webhook-id and event type on its span (the pipeline knows them once
    the signature verified; a scheme may take the id from its own header)."""
    if _current.get() is None:
        return
    span = trace.get_current_span()
    if webhook_id is not None:
        span.set_attribute("webhook.id", webhook_id)
    if event_type:
        span.set_attribute("webhook.event_type", event_type)


class DeliverySpan:
    """The attributes a delivery span gets from the answer."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def finish(self, outcome: str, status: int, fence: int | None, check: str | None) -> None:
        span = self._span
        span.set_attribute("webhook.outcome", outcome)
        span.set_attribute("http.response.status_code", status)
        if fence is not None:
            span.set_attribute("webhook.fence", fence)
        if check is not None and outcome == "rejected":
            span.set_attribute("webhook.rejected_check", check)
        if outcome in _ERRORS:
            span.set_status(Status(StatusCode.ERROR, outcome))


@contextlib.contextmanager
def _handler_span(tracer: Tracer, handler: Handler, event: Event) -> Iterator[None]:
    with tracer.start_as_current_span(
        f"handler {handler.func.__qualname__}",
        kind=SpanKind.INTERNAL,
        attributes={
            "webhook.provider": event.provider,
            "webhook.id": event.id,
            "webhook.event_type": event.type,
            "webhook.fence": event.fence or 0,
            "receiver.handler.effects": handler.effects,
        },
        # OpenTelemetry's own recording puts str(exc) and a traceback with every message in
        # the span: a driver's text carries payload values. Recorded below, redacted.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            record_failure(span, exc)
            raise


def record_failure(span: trace.Span, exc: BaseException) -> None:
    """The exception on ``span`` as the logs describe it: its class, a driver's message with
    its values masked (receiver/_ops/redact.py), and where it was raised, without any message."""
    name = type(exc).__name__
    span.add_event(
        "exception",
        {
            "exception.type": type(exc).__qualname__,  # as OpenTelemetry names it
            "exception.message": describe(exc),
            "exception.stacktrace": stack(exc),
        },
    )
    span.set_status(Status(StatusCode.ERROR, name))


def handler_span(handler: Handler, event: Event) -> contextlib.AbstractContextManager[None]:
    """A child span around one handler call of a traced delivery (an exception it raises is
    recorded, redacted, and sets the span's status to error); a null context otherwise."""
    tracer = _current.get()
    if tracer is None:
        return _UNTRACED
    return _handler_span(tracer, handler, event)
