"""A client that retries keyed requests against a user's own ASGI app behind the
:class:`~receiver.IdempotencyKeyMiddleware`: the same key again, concurrent copies through one
barrier, a connection dropped before the answer, a body re-serialized by another client
library; and faults injected behind the middleware.

In-process: the client calls the app as a server does (the lifespan, then one ASGI call per
request) and records each :class:`Answer`. The middleware is found in the app's stack; the
app it wraps (the endpoints) is wrapped in turn by :class:`EndpointFaults`, so the user's code
is untouched. A "death" is :class:`~receiver.testing.SimulatedCrash`: the ledger's transaction
rolls back, nothing is answered, and the key stays in flight until its lease runs out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import (
    ConfigurationError,
    IdempotencyKeyMiddleware,
    IdempotencyProxy,
    State,
    idempotent_request,
)
from .._proxy.attempt import proxied_request
from ._faults import ArmedFaults, Fault, InjectedFailure, SimulatedCrash

_PROBLEM = "urn:receiver:idempotency:"
# The middleware's own refusals, by the code its problem+json ``type`` ends with.
_REFUSALS = {
    "in-flight": "in_flight",
    "lease-lost": "in_flight",
    "key-reused": "mismatch",
    "invalid-key": "refused",
    "missing-key": "refused",
    "too-large": "refused",
    "store-unavailable": "failed",
    "upstream": "failed",  # the proxy's 502/504: nothing stored, the client retries
}
# Keys unique in the process: two clients (two principals) never share one by accident.
_KEYS = itertools.count(1)

#: How other client libraries write the same JSON body (:func:`reserialize`).
STYLES = ("spaced", "pretty", "reordered")


@dataclass(frozen=True, slots=True)
class KeyedRequest:
    """One request with its Idempotency-Key; its body is fixed when it is made, and every send
    repeats it byte for byte."""

    method: str
    path: str
    body: bytes
    key: str | None
    headers: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"<{self.method} {self.path} key={self.key}>"


@dataclass(frozen=True, slots=True)
class Answer:
    """One attempt as the client saw it. ``status`` is None when the serving process died
    before answering (an injected crash); ``dropped``: the client had hung up, so the answer
    never reached it (the server ran the request anyway)."""

    key: str | None
    status: int | None
    content_type: str = ""
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    dropped: bool = False

    @property
    def replayed(self) -> bool:
        return ("idempotent-replayed", "true") in self.headers

    @property
    def outcome(self) -> str:
        """``executed`` (the endpoint ran to an answer that was stored), ``replayed``,
        ``in_flight`` (409: the first request still runs), ``mismatch`` (422: the key was used
        with another request), ``refused`` (400, 413: a bad or missing key), ``failed`` (5xx:
        nothing stored, the client retries) or ``died``."""
        if self.status is None:
            return "died"
        if self.replayed:
            return "replayed"
        code = self._problem()
        if code is not None:
            return _REFUSALS.get(code, "refused")
        if self.status >= 500:
            return "failed"
        return "executed"

    @property
    def answer(self) -> tuple[int | None, str, bytes]:
        """What a replay must repeat byte for byte: status, content type, body."""
        return (self.status, self.content_type, self.body)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)

    def _problem(self) -> str | None:
        if not self.content_type.startswith("application/problem+json"):
            return None
        try:
            kind = orjson.loads(self.body).get("type", "")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return kind.removeprefix(_PROBLEM) if str(kind).startswith(_PROBLEM) else None

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 80 else self.body[:77] + b"..."
        gone = " (dropped: the client had hung up)" if self.dropped else ""
        return f"<{self.key}: {self.outcome} {self.status} {body!r}{gone}>"


def reserialize(request: KeyedRequest, style: str = "spaced") -> KeyedRequest:
    """``request`` with its JSON body written as another client library writes it: the same
    value, other bytes. ``"spaced"``: Python's ``json.dumps`` as ``requests`` sends it (``", "``
    and ``": "``, non-ASCII escaped); ``"pretty"``: indented, keys sorted; ``"reordered"``:
    compact, every object's keys in reverse order. Numbers are written as they were: ``1`` and
    ``1.0`` are different requests to the middleware."""
    try:
        value = json.loads(request.body)
    except ValueError as exc:
        raise ConfigurationError(f"only a JSON body can be re-serialized: {exc}") from exc
    if style == "spaced":
        text = json.dumps(value)
    elif style == "pretty":
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    elif style == "reordered":
        text = json.dumps(_reversed(value), separators=(",", ":"), ensure_ascii=False)
    else:
        raise ConfigurationError(f"unknown style {style!r}; one of {', '.join(STYLES)}")
    return dataclasses.replace(request, body=text.encode())


def _reversed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed(v) for v in value]
    return value


#: What serves keyed requests: the middleware in front of the user's endpoints, or the proxy in
#: front of an upstream (its forwarding step stands for the endpoints).
Keyed = IdempotencyKeyMiddleware | IdempotencyProxy


def find_middleware(app: ASGIApp) -> Keyed:
    """The IdempotencyKeyMiddleware (or IdempotencyProxy) in ``app``'s stack: through Starlette's
    and FastAPI's built middleware stack, any middleware's ``.app`` and mounted apps."""
    queue: collections.deque[Any] = collections.deque([app])
    seen: set[int] = set()
    while queue and len(seen) < 200:
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, IdempotencyKeyMiddleware | IdempotencyProxy):
            return node
        if getattr(node, "middleware_stack", False) is None and callable(
            getattr(node, "build_middleware_stack", None)
        ):
            # Starlette builds its stack on its first call; build it as it would.
            node.middleware_stack = node.build_middleware_stack()
        queue.extend([getattr(node, "middleware_stack", None), getattr(node, "app", None)])
        queue.extend(getattr(route, "app", None) for route in getattr(node, "routes", None) or ())
    raise ConfigurationError(
        "no IdempotencyKeyMiddleware found in the app's stack; pass it as middleware= "
        "(the instance that serves the requests)"
    )


class EndpointFaults(ArmedFaults):
    """The faults armed behind one middleware, per Idempotency-Key. Install once.

    `Fault.AFTER_CLAIM` strikes before the endpoint runs; ``BEFORE_COMMIT`` and
    ``AFTER_EXTERNAL_CALL`` after it answered (its ``tx`` writes made, its outside calls done),
    before the answer is stored; ``HANDLER_ERROR`` makes it raise after its work (the server
    answers 500; the key is given back).
    """

    def __init__(self, middleware: Keyed) -> None:
        super().__init__()
        #: The principal of each key that reached the endpoints (to read its state).
        self.principals: dict[str, str] = {}
        self._started: dict[str, asyncio.Event] = {}
        endpoints = middleware.app

        async def with_faults(scope: Scope, receive: Receive, send: Send) -> None:
            keyed = idempotent_request(scope) or proxied_request(scope)
            if keyed is None:
                await endpoints(scope, receive, send)
                return
            self.principals[keyed.key] = keyed.principal
            started = self._started.pop(keyed.key, None)
            if started is not None:
                started.set()
            fault = self._take(keyed.key)
            if fault is Fault.AFTER_CLAIM:
                raise SimulatedCrash(f"{keyed.key}: died after the claim")
            await endpoints(scope, receive, send)
            if fault is Fault.HANDLER_ERROR:
                raise InjectedFailure(f"{keyed.key}: the endpoint failed after its work")
            if fault is not None:
                raise SimulatedCrash(f"{keyed.key}: died {fault.value.replace('_', ' ')}")

        middleware.app = with_faults

    @classmethod
    def of(cls, middleware: Keyed) -> EndpointFaults:
        """The faults behind ``middleware``, installed on first use."""
        found = getattr(middleware, "_testing_faults", None)
        if isinstance(found, EndpointFaults):
            return found
        faults = cls(middleware)
        middleware._testing_faults = faults  # type: ignore[union-attr]
        return faults

    def started(self, key: str) -> asyncio.Event:
        """Set when the next request with ``key`` reaches the endpoint."""
        return self._started.setdefault(key, asyncio.Event())


class Client:
    """Sends keyed requests to the user's ASGI ``app``, in this process, as a client that
    retries does; records each `Answer`. ``headers`` go with every request (the
    credentials the app's ``principal`` reads). ``async with Client(app) as client:`` runs the
    app's lifespan (its startup creates tables, the middleware's sweeper starts) unless
    ``lifespan=False``.

    The kit runs on a fake clock: a retry whose key is held by a dead request can only be told
    "in progress" until the test moves the clock, so it is not made to wait the middleware's
    ``wait`` of real time for that answer.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        middleware: Keyed | None = None,
        lifespan: bool = True,
    ) -> None:
        self.app = app
        items = headers.items() if isinstance(headers, Mapping) else headers
        self.headers = tuple((k.lower(), v) for k, v in items)
        self._middleware = middleware
        self._lifespan = lifespan
        self._state: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._running: collections.Counter[str] = collections.Counter()
        self._ports = itertools.count(50_000)

    @property
    def middleware(self) -> Keyed:
        """The middleware that serves the requests (its ``lease``, ``sweep()``, ``inspect``)."""
        if self._middleware is None:
            self._middleware = find_middleware(self.app)
        return self._middleware

    @property
    def faults(self) -> EndpointFaults:
        return EndpointFaults.of(self.middleware)

    # -- requests --------------------------------------------------------------------------------

    def request(
        self,
        path: str,
        json: Any = None,
        *,
        method: str = "POST",
        key: str | None = "",
        headers: Mapping[str, str] | None = None,
    ) -> KeyedRequest:
        """A new request: ``json`` as its body, and a fresh Idempotency-Key (``key=`` to give
        one; None sends none)."""
        try:
            body = b"" if json is None else orjson.dumps(json)
        except TypeError as exc:
            raise ConfigurationError(f"the request's json must encode as JSON: {exc}") from exc
        if key == "":
            key = str(uuid.UUID(int=next(_KEYS)))
        extra = tuple((k.lower(), v) for k, v in (headers or {}).items())
        return KeyedRequest(method.upper(), path, body, key, extra)

    async def send(self, request: KeyedRequest, *, fault: Fault | None = None) -> Answer:
        """Send ``request`` once; ``fault`` strikes it if it reaches the endpoint."""
        with self._waiting(await self._patience(request)):
            if fault is not None and request.key is not None:
                self.faults.arm(request.key, fault)
            try:
                return await self._call(request)
            finally:
                if fault is not None:
                    self.faults.disarm()  # a fault belongs to this request only

    async def copies(self, request: KeyedRequest, copies: int = 10) -> list[Answer]:
        """``copies`` concurrent sends of ``request``, released together through one barrier."""
        if copies < 1:
            raise ConfigurationError(f"copies needs at least one copy, not {copies}")
        barrier = asyncio.Barrier(copies)

        async def one() -> Answer:
            await barrier.wait()
            return await self._call(request)

        with self._waiting(await self._patience(request)):
            return list(await asyncio.gather(*(one() for _ in range(copies))))

    async def drop(self, request: KeyedRequest) -> list[Answer]:
        """The client sends ``request``, hangs up before the answer and retries at once: the
        server runs the first to its end (as uvicorn does: a disconnect cancels nothing) while
        the retry comes in, once the first reached the endpoint. Returns both answers, the
        first marked ``dropped`` (its client never saw it)."""
        with self._waiting(await self._patience(request)):
            reached = self.faults.started(request.key) if request.key else asyncio.Event()
            first = asyncio.ensure_future(self._call(request, dropped=True))
            watching = asyncio.ensure_future(reached.wait())
            await asyncio.wait({first, watching}, return_when=asyncio.FIRST_COMPLETED)
            watching.cancel()
            retry = await self._call(request)
            return [await first, retry]

    # -- the ASGI calls --------------------------------------------------------------------------

    async def _call(self, request: KeyedRequest, *, dropped: bool = False) -> Answer:
        sent = False
        gone = asyncio.Event()
        if dropped:
            gone.set()
        start: Message | None = None
        chunks: list[bytes] = []

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()  # a server's next message: the disconnect, when it comes
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    gone.set()

        key = request.key or ""
        self._running[key] += 1
        try:
            await self.app(self._scope(request), receive, send)
        except SimulatedCrash:
            return Answer(request.key, None, dropped=dropped)
        except Exception:
            if start is None:
                # What a server answers for an app that raised before answering.
                text = "text/plain; charset=utf-8"
                return Answer(request.key, 500, text, b"Internal Server Error", dropped=dropped)
        finally:
            self._running[key] -= 1
            gone.set()
        if start is None:
            return Answer(request.key, 500, "", b"", dropped=dropped)
        headers = tuple(
            (bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1"))
            for k, v in start.get("headers", [])
        )
        content_type = next((v for k, v in headers if k == "content-type"), "")
        return Answer(
            request.key, int(start["status"]), content_type, b"".join(chunks), headers, dropped
        )

    def _scope(self, request: KeyedRequest) -> Scope:
        path, _, query = request.path.partition("?")
        headers = [("host", "testserver")]
        if request.body:
            headers += [("content-type", "application/json")]
        headers += [("content-length", str(len(request.body)))]
        if request.key is not None:
            headers += [("idempotency-key", request.key)]
        headers += [*self.headers, *request.headers]
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            "client": ("127.0.0.1", next(self._ports)),
            "server": ("testserver", 80),
            "state": dict(self._state),
        }

    async def _patience(self, request: KeyedRequest) -> bool:
        """Whether a retry may wait the middleware's ``wait`` for the request holding its key:
        not when that request is dead (nothing on a fake clock can end it during the wait)."""
        middleware = self.middleware
        key = request.key
        if middleware.wait == 0 or key is None or self._running[key]:
            return True
        principal = self.faults.principals.get(key)
        if principal is None:
            return True  # never reached the endpoint: no request holds it
        state = await middleware.inspect(principal, key)
        if state is None or state.state is not State.IN_FLIGHT:
            return True
        now = middleware.store.now()
        return state.lease_until <= (time.time() if now is None else now)

    @contextlib.contextmanager
    def _waiting(self, patient: bool) -> Iterator[None]:
        middleware = self.middleware
        saved = middleware.wait
        if not patient:
            middleware.wait = 0.0
        try:
            yield
        finally:
            middleware.wait = saved

    # -- the lifespan ----------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        if self._lifespan:
            await self._startup()
        try:
            EndpointFaults.of(self.middleware)  # before the first request reaches the endpoints
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._shutdown()

    async def _startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        scope["state"] = self._state
        self._task = asyncio.create_task(self._serve(scope))
        await self._to_app.put({"type": "lifespan.startup"})
        message = await self._lifespan_message()
        if message is None:
            return  # the app does not speak the lifespan protocol: served without it
        if message["type"] != "lifespan.startup.complete":
            await self._shutdown()
            raise ConfigurationError(f"the app's startup failed: {message.get('message', '')}")

    async def _serve(self, scope: Scope) -> None:
        await self.app(scope, self._to_app.get, self._from_app.put)

    async def _shutdown(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            await self._to_app.put({"type": "lifespan.shutdown"})
            await self._lifespan_message(task)
        with contextlib.suppress(Exception):
            await task

    async def _lifespan_message(self, task: asyncio.Task[None] | None = None) -> Message | None:
        """The app's next lifespan message; None if it ended instead (no lifespan support)."""
        task = task or self._task
        assert task is not None
        getting = asyncio.ensure_future(self._from_app.get())
        await asyncio.wait({getting, task}, return_when=asyncio.FIRST_COMPLETED)
        if getting.done():
            return getting.result()
        getting.cancel()
        return None

    def __repr__(self) -> str:
        return f"Client({self.app!r})"
