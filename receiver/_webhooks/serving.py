"""The Receiver served over HTTP: ``POST /{provider}`` read (within the body limit), traced and
handed to the pipeline; everything else goes through the inner Starlette app (lifespan, health,
metrics, 404, 405)."""

from __future__ import annotations

import asyncio
import time

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from .._exceptions import SchemaOutdated, StoreMisconfigured, StoreUnavailable
from .._ledger.responses import error, replay
from .._ops.forwarded import TrustedProxies
from .._queue.receipts import QUEUED
from .admission import Admission, Ticket, shed_reply
from .handoff import Handoffs, Turn, budget
from .lifecycle import Lifecycle
from .outcomes import Outcome, Reply
from .providers import Provider
from .tracing import Tracing


class _TooLarge(Exception):
    pass


def _route_path(scope: Scope) -> str:
    """The path below the mount point. Starlette's Mount keeps the full ``path`` and extends
    ``root_path`` with the prefix (starlette._utils.get_route_path does the same)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


class Serving(Lifecycle):
    """The HTTP side of a :class:`~receiver.Receiver`."""

    max_body_size: int
    admission: Admission
    trusted_proxies: TrustedProxies
    tracing: Tracing
    handoffs: Handoffs
    _open_lock: asyncio.Lock
    _app: Starlette

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The webhook route, straight: a delivery to a configured provider skips the inner
        # Starlette app (its middleware and router cost a sixth of a replay, by the profile).
        # Everything else (lifespan, health, metrics, 404, 405) goes through that app.
        if scope["type"] == "http" and scope["method"] == "POST":
            provider = self.providers.get(_route_path(scope)[1:])
            if provider is not None:
                # When the delivery arrived: its wait counts against its sender's time limit.
                arrived = time.perf_counter()
                if self.admission.full() and self._opened:
                    # Shed at once, before the body is read and before anything is built for
                    # it: under a flood, each refusal must cost far less than a delivery.
                    reply = self._shed(provider, Headers(scope=scope), "overloaded", arrived)
                    await reply.response(scope, receive, send)
                    return
                response = await self._deliver_http(Request(scope, receive), provider, arrived)
                await response(scope, receive, send)
                return
        if scope["type"] == "lifespan":
            send = self._lifespan_send(send)
        await self._app(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        """``send`` for the lifespan: a start-up the lifespan refused has been reported in
        its ALERT line, so Starlette's traceback of it is left out."""

        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and self._startup_refused:
                message = {**message, "message": ""}
            await send(message)

        return lifespan_send

    async def deliver(
        self,
        provider: str,
        headers: Headers | dict[str, str],
        body: bytes,
        *,
        waited: float = 0.0,
    ) -> Response:
        """Process one delivery without HTTP (for tests, queues and replays). ``waited``: the
        seconds it has already waited since it arrived, counted against its sender's time
        limit."""
        found = self.providers.get(provider)
        if found is None:
            return error(404, "unknown_provider", f"no provider named {provider!r}")
        arrived = self.admission.clock() - waited
        reply = await self._traced(found, Headers(headers=dict(headers)), body, None, arrived)
        return reply.response

    async def _endpoint(self, request: Request) -> Response:
        provider = self.providers.get(request.path_params["provider"])
        if provider is None:
            return error(404, "unknown_provider", "no provider is configured at this path")
        if request.method != "POST":
            detail = f"webhooks are delivered with POST, not {request.method}"
            return error(405, "method_not_allowed", detail, {"allow": "POST"})
        return await self._deliver_http(request, provider, time.perf_counter())

    async def _deliver_http(
        self, request: Request, provider: Provider, arrived: float | None = None
    ) -> Response:
        name = provider.name
        try:
            body = await self._read_body(request)
        except _TooLarge:
            detail = f"the body exceeds {self.max_body_size} bytes"
            return self._refused(name, request, 413, "body_too_large", detail)
        except ValueError:
            detail = "the Content-Length header is not a number"
            return self._refused(name, request, 400, "content_length", detail)
        except ClientDisconnect:
            # Nobody is listening; nothing was read into the store. 499 is nginx's convention.
            detail = "the client went away mid-body"
            return self._refused(name, request, 499, "client_disconnected", detail)
        peer = request.client.host if request.client else None
        client = self.trusted_proxies.client(peer, request.headers)
        reply = await self._traced(provider, request.headers, body, client, arrived)
        return reply.response

    async def _traced(
        self,
        provider: Provider,
        headers: Headers,
        body: bytes,
        client: str | None = None,
        arrived: float | None = None,
    ) -> Reply:
        """``pipeline.deliver`` in a span of its own when an OpenTelemetry SDK is configured,
        once admitted: shed (nothing claimed) past the bound or the sender's time limit."""
        if not self._opened:
            refused = await self._open_on_first_delivery()
            if refused is not None:
                return self.pipeline.unavailable(provider.name, headers, refused)
        if self._pending_startup is not None:
            starting = self._not_ready or StoreUnavailable("the startup hooks have not run yet")
            return self.pipeline.unavailable(provider.name, headers, starting)
        admission = self.admission
        started = admission.clock()
        waited = 0.0 if arrived is None else started - arrived
        # What the metrics and the log report is the time from arrival to answer, the wait for
        # a place included: under a flood, that wait is most of what the sender sees.
        since = started if arrived is None else arrived
        name = provider.name
        if admission.past_budget(waited, provider.timeout, name):
            return self._shed(provider, headers, "past_budget", since)
        # Past the bound, wait for a place while the sender's budget lasts, leaving the time the
        # provider's deliveries take now and the answer's margin (receiver/_webhooks/
        # admission.py: held, the request is the flood's brake; refused, the sender's next
        # would come at once).
        patience = admission.max_wait
        if provider.timeout is not None:
            patience = budget(provider.timeout, waited) - admission.expected(name)
        ticket = await admission.admit(patience, len(body), name)
        if ticket is None:
            return self._shed(provider, headers, "overloaded", since)
        if provider.handoff and provider.timeout is not None and provider.mode == "inline":
            left = budget(provider.timeout, waited + admission.clock() - started)
            return await self._handoff(provider, headers, body, client, ticket, left, since)
        try:
            return await self._deliver_admitted(provider, headers, body, client, since)
        finally:
            admission.leave(ticket)

    async def _handoff(
        self,
        provider: Provider,
        headers: Headers,
        body: bytes,
        client: str | None,
        ticket: Ticket,
        within: float,
        arrived: float,
    ) -> Reply:
        """The delivery as a task: its own answer if it finishes ``within`` seconds, else 202
        as queued mode answers, while it runs on to completion (receiver/_webhooks/handoff.py).
        It holds its place in admission until it ends."""
        turn = Turn()

        async def work() -> Reply:
            try:
                return await self._deliver_admitted(provider, headers, body, client, arrived, turn)
            finally:
                self.admission.leave(ticket)

        reply = await self.handoffs.run(work(), within, turn)
        if reply is None:
            reply = Reply(replay(QUEUED, replayed=False), Outcome.HANDED_OFF)
            self.pipeline._report(provider.name, None, None, reply, arrived, headers)
        return reply

    def _shed(self, provider: Provider, headers: Headers, reason: str, started: float) -> Reply:
        """Answer at once, before verification and before anything touches the store."""
        self.admission.shed(reason)
        retry = self.admission.retry_after(self.pipeline.retry_after)
        reply = shed_reply(provider.shed_status, reason, retry)
        self.pipeline._report(provider.name, None, None, reply, started, headers)
        return reply

    async def _deliver_admitted(
        self,
        provider: Provider,
        headers: Headers,
        body: bytes,
        client: str | None,
        arrived: float,
        turn: Turn | None = None,
    ) -> Reply:
        tracer = self.tracing.tracer()
        if tracer is None:
            return await self.pipeline.deliver(provider, headers, body, client, arrived, turn)
        with self.tracing.delivery(tracer, provider.name, headers) as span:
            reply = await self.pipeline.deliver(provider, headers, body, client, arrived, turn)
            span.finish(reply.outcome.value, reply.response.status_code, reply.fence, reply.detail)
        return reply

    async def _open_on_first_delivery(self) -> StoreUnavailable | None:
        """Open the store and run the startup hooks before the first delivery of a Receiver
        that no lifespan opened. If the store cannot be opened or its schema is not current,
        the store error the delivery is answered with (503; the next one tries again)."""
        async with self._open_lock:
            if not self._opened:
                try:
                    await self.open(defer_startup=True)
                except StoreUnavailable as exc:
                    return exc
                except SchemaOutdated as exc:
                    return StoreMisconfigured(str(exc))
        return None

    def _refused(
        self, name: str, request: Request, status: int, check: str, detail: str
    ) -> Response:
        """Refused before verification; logged and counted like any rejection."""
        reply = self.pipeline.refused(name, request.headers, error(status, check, detail), check)
        return reply.response

    async def _read_body(self, request: Request) -> bytes:
        """Read the body, refusing one over the limit before reading it all."""
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise ValueError(declared)
            if int(declared) > self.max_body_size:
                raise _TooLarge
        # Straight from ``receive`` rather than through ``request.stream()``: an async
        # generator per delivery costs its frame and the event loop's generator hooks.
        chunks: list[bytes] = []
        size = 0
        receive = request.receive
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientDisconnect
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_size:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error(
            exc.status_code,
            codes.get(exc.status_code, "http_error"),
            exc.detail,
            exc.headers,
        )
