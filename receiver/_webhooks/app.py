"""The Receiver: an ASGI app serving ``POST /{provider}``, with handlers registered by decorator."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .._exceptions import (
    ConfigurationError,
    SchemaOutdated,
    StoreMisconfigured,
    StoreUnavailable,
)
from .._ledger.cache import ReplayCache
from .._ledger.responses import error
from .._ledger.results import Encoder
from .._logging import get_logger
from .._ops.health import check_ready, observability_routes, reserved_names
from .._ops.metrics import Metrics
from .._ops.sweeper import Recoverer, SweepReport, sweep_forever
from .._queue.ingest import enqueue_many
from .._store.base import Connection, Store
from .._store.migrations import check_current
from .._store.url import store_from_url
from .events import Event
from .forwarded import TrustedProxies
from .handlers import Effects, Handler, HandlerFunc, Mode, ReconcileFunc, Registry
from .outcomes import Reply
from .pipeline import Pipeline
from .providers import Provider
from .replay import replay
from .sweeper import sweep
from .tracing import Tracing
from .worker import Worker

if TYPE_CHECKING:
    from .._console import Console

F = TypeVar("F", bound=HandlerFunc)
StartupHook = Callable[[Connection], Awaitable[None]]

DEFAULT_STORE = "sqlite:///receiver.db"
DEFAULT_MAX_BODY = 1024 * 1024
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]
# What a verified webhook-id is (receiver/_verification/schemes.py): 1-255 visible ASCII.
_WEBHOOK_ID = re.compile(r"[\x21-\x7e]{1,255}")


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


class Receiver:
    """Receive webhooks so that each event takes effect once.

    ::

        rx = Receiver(store="postgresql://localhost/app", providers=[Provider("acme", [secret])])

        @rx.on("invoice.paid")
        async def paid(event, tx):
            await tx.execute("UPDATE invoices SET paid = true WHERE id = $1", event.payload["id"])

        app.mount("/webhooks", rx)   # POST /webhooks/acme

    Served alone (``uvicorn module:rx``) the store opens in the ASGI lifespan. Mounted into
    another app, it opens on the first delivery, or use ``lifespan=rx.lifespan`` (or
    ``async with rx:``) in the host application to open and close it with the app.

    ``encoder`` turns what a handler returns into JSON where it is not already (Decimal,
    dataclasses, datetimes, UUIDs, enums and Pydantic models need none).
    """

    def __init__(
        self,
        store: Store | str = DEFAULT_STORE,
        providers: Sequence[Provider] = (),
        *,
        max_body_size: int = DEFAULT_MAX_BODY,
        clock: Callable[[], float] = time.time,
        retry_after: int = 5,
        sweep_interval: float | None = 60.0,
        trusted_proxies: Sequence[str] | str = (),
        metrics: bool = True,
        metrics_path: str | None = "/metrics",
        registry: CollectorRegistry | None = None,
        health: bool = True,
        replay_cache: int = 10_000,
        tracer_provider: TracerProvider | None = None,
        workers: int = 0,
        encoder: Encoder | None = None,
    ) -> None:
        self.store: Store = store_from_url(store) if isinstance(store, str) else store
        if max_body_size <= 0:
            raise ConfigurationError(f"max_body_size must be positive, not {max_body_size}")
        self.max_body_size = max_body_size
        if sweep_interval is not None and not sweep_interval > 0:
            raise ConfigurationError(
                f"sweep_interval must be positive seconds, or None to disable the background "
                f"sweeper, not {sweep_interval!r}"
            )
        self.sweep_interval = sweep_interval
        self.clock = clock
        # Whose X-Forwarded-For / X-Real-IP to believe for event.client
        # (receiver/_webhooks/forwarded.py).
        self.trusted_proxies = TrustedProxies(trusted_proxies)
        self._sweeper: asyncio.Task[None] | None = None
        # Who recovers the stale claims of keys that are not webhook-ids, by namespace
        # (receiver/_ledger/keyed.py): the action executor registers itself here.
        self.recoverers: dict[str, Recoverer] = {}
        # Prometheus metrics (rx.metrics.registry), GET /metrics, /healthz and /readyz.
        self.metrics: Metrics | None = Metrics(registry) if metrics else None
        routes = observability_routes(self.store, self.metrics, metrics_path, health, clock)
        self._reserved = reserved_names(routes)
        self.providers: dict[str, Provider] = {}
        for provider in providers:
            self.add_provider(provider)
        self.registry = Registry()
        self._startup: list[StartupHook] = []
        #: Startup hooks that met the store down: retried until they have run, and deliveries
        #: are answered 503 meanwhile (a handler must not run before its tables exist).
        self._pending_startup: asyncio.Task[None] | None = None
        #: Opened by the lifespan, ``async with rx:``, or else the first delivery (a Receiver
        #: mounted where no lifespan reaches it still runs its startup hooks first).
        self._opened = False
        self._open_lock = asyncio.Lock()
        if replay_cache < 0:
            raise ConfigurationError(
                f"replay_cache must be >= 0 (0 disables it), not {replay_cache}"
            )
        self.pipeline = Pipeline(
            self.store,
            self.registry,
            clock=clock,
            retry_after=retry_after,
            metrics=self.metrics,
            # Completed receipts this process has seen, replayed without a round trip.
            cache=ReplayCache(replay_cache) if replay_cache else None,
            encoder=encoder,
        )
        # OpenTelemetry spans (receiver/_webhooks/tracing.py): the global provider unless one is
        # given;
        # a no-op until an SDK is configured.
        self.tracing = Tracing(tracer_provider)
        # Queued mode: ``workers`` in-process worker slots run queued deliveries in the app's
        # lifespan (small deployments); 0 leaves them to ``receiver worker`` processes.
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ConfigurationError(f"workers must be an integer >= 0, not {workers!r}")
        self.workers = workers
        self._worker: Worker | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._app = Starlette(
            # Every method (Starlette's default for a function is GET only): an unknown provider
            # is 404 whatever the method; _endpoint answers 405 to a known provider's others.
            routes=[*routes, Route("/{provider}", self._endpoint, methods=_METHODS)],
            exception_handlers={HTTPException: self._http_error},
            lifespan=self.lifespan,
        )

    # -- configuration -------------------------------------------------------------------------

    def add_provider(self, provider: Provider) -> None:
        if provider.name in self.providers:
            raise ConfigurationError(f"provider {provider.name!r} is configured twice")
        if provider.name in self._reserved:
            raise ConfigurationError(
                f"provider {provider.name!r} would share GET /{provider.name} with the "
                "receiver's own endpoint: rename the provider, or move or disable the endpoint "
                "(metrics_path=..., health=False)"
            )
        self.providers[provider.name] = provider
        if self.metrics is not None:
            self.metrics.add_provider(provider.name)

    def add_handler(
        self,
        event_type: str,
        func: HandlerFunc,
        *,
        provider: str | None = None,
        effects: Effects = "transactional",
        reconcile: ReconcileFunc | None = None,
        lease: float | None = None,
        mode: Mode = "inline",
    ) -> Handler:
        """Register ``func`` for ``event_type``: an exact type, a prefix such as ``"invoice.*"``,
        or ``"*"``. Several handlers of one event run in one transaction: exact types first,
        then prefixes (longest first), then ``"*"``, each group in registration order."""
        if provider is not None and provider not in self.providers:
            raise ConfigurationError(
                f"handler {func.__qualname__} names unknown provider {provider!r}; "
                f"configured: {sorted(self.providers)}"
            )
        if lease is not None:
            for p in self.providers.values():
                if (provider is None or p.name == provider) and p.window.window < lease:
                    raise ConfigurationError(
                        f"handler {func.__qualname__}: its lease ({lease:g} s) outlasts the dedup "
                        f"window of provider {p.name!r} ({p.window.window:g} s); a receipt must "
                        "not expire while an attempt still holds it: lower the lease or raise "
                        "the provider's ttl"
                    )
        return self.registry.add(
            event_type,
            func,
            provider=provider,
            effects=effects,
            reconcile=reconcile,
            lease=lease,
            mode=mode,
        )

    def on(
        self,
        event_type: str,
        *,
        provider: str | None = None,
        effects: Effects = "transactional",
        reconcile: ReconcileFunc | None = None,
        lease: float | None = None,
        mode: Mode = "inline",
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`add_handler`."""

        def register(func: F) -> F:
            self.add_handler(
                event_type,
                func,
                provider=provider,
                effects=effects,
                reconcile=reconcile,
                lease=lease,
                mode=mode,
            )
            return func

        return register

    def on_startup(self, func: StartupHook) -> StartupHook:
        """Run ``func(conn)`` once when the receiver opens its store, e.g. to create the
        handlers' own tables."""
        self._startup.append(func)
        return func

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self, *, defer_startup: bool = False) -> None:
        """Open the store, check its schema, and run the startup hooks. If the store is
        unavailable when the hooks run, this raises :class:`~receiver.StoreUnavailable`;
        with ``defer_startup=True`` (what serving does) the hooks are retried in the
        background instead, and deliveries are answered 503 until they have run."""
        await self.store.open()
        # Never serve on an older schema: fail here, naming the missing migrations.
        await check_current(self.store)
        # Loud at start-up: a missing database, table or privilege, or a read-only standby,
        # would otherwise show only as 503s once deliveries arrive. Serving starts anyway (the
        # answer is then 503, which senders retry), so that fixing the store is enough.
        problem = await check_ready(self.store)
        if problem is not None:
            get_logger("receiver").error("ALERT: the store is not ready: %s", problem)
        try:
            await self._run_startup_hooks()
        except StoreUnavailable as exc:
            if not defer_startup:
                raise
            get_logger("receiver").error(
                "ALERT: the startup hooks could not run, the store is unavailable (%s); "
                "deliveries are answered 503 until they have run",
                exc,
            )
            self._pending_startup = asyncio.create_task(
                self._retry_startup_hooks(), name="receiver-startup-hooks"
            )
        self._opened = True

    async def _run_startup_hooks(self) -> None:
        if self._startup:
            async with self.store.acquire() as conn:
                for hook in self._startup:
                    await hook(conn)

    async def _retry_startup_hooks(self) -> None:
        logger = get_logger("receiver")
        delay = 0.25
        while True:
            await asyncio.sleep(delay)
            try:
                await self._run_startup_hooks()
            except StoreUnavailable as exc:
                logger.warning("startup hooks: store unavailable (%s); retry in %.1f s", exc, delay)
            except Exception:
                # A hook's own bug: loud, and retried slowly (its fix may be in the database).
                logger.exception("ALERT: a startup hook failed; deliveries are answered 503")
                delay = 30.0
            else:
                logger.info("startup hooks ran; serving deliveries")
                self._pending_startup = None
                return
            delay = min(delay * 2, 5.0) if delay < 30.0 else delay

    async def close(self) -> None:
        if self._pending_startup is not None:
            self._pending_startup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pending_startup
            self._pending_startup = None
        self._opened = False
        await self.store.close()

    async def __aenter__(self) -> Receiver:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """An ASGI lifespan: ``Starlette(..., lifespan=rx.lifespan)``. Opens the store and runs
        the background sweeper (every ``sweep_interval`` seconds) while the app serves. A
        store that is down at start does not stop it: deliveries are answered 503 until the
        store answers and the startup hooks have run."""
        await self.open(defer_startup=True)
        try:
            if self.sweep_interval is not None:
                self._sweeper = asyncio.create_task(
                    sweep_forever(self.sweep, self.sweep_interval), name="receiver-sweeper"
                )
            if self.workers:
                self._start_workers()
            try:
                yield
            finally:
                await self._stop_workers()
                if self._sweeper is not None:
                    self._sweeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._sweeper
                    self._sweeper = None
        finally:
            await self.close()

    def worker(self, **options: float) -> Worker:
        """A :class:`~receiver.Worker` for this receiver's queued deliveries (what
        ``receiver worker`` runs); woken at once by this process's own ingest."""
        worker = Worker(self, **options)  # type: ignore[arg-type]
        self.pipeline.ingest.on_enqueued = worker.wake
        return worker

    def _start_workers(self) -> None:
        self._worker = self.worker(concurrency=self.workers)
        self._worker_task = asyncio.create_task(
            self._run_worker(self._worker), name="receiver-worker"
        )

    async def _run_worker(self, worker: Worker) -> None:
        # Queued handlers must not run before the startup hooks (their tables) either.
        if self._pending_startup is not None:
            await asyncio.shield(self._pending_startup)
        await worker.run()

    async def _stop_workers(self) -> None:
        if self._worker is not None and self._worker_task is not None:
            self._worker.stop()
            await self._worker_task
        self._worker = self._worker_task = None

    async def sweep(self, *, batch: int = 100) -> SweepReport:
        """One sweeper pass: recover or fail stale in-flight receipts, delete expired ones."""
        now = self.store.now()
        report = await sweep(
            self.store,
            self.pipeline,
            self.providers,
            now=now,
            batch=batch,
            recoverers=self.recoverers,
        )
        if self.metrics is not None:
            await self.metrics.refresh(self.store, self.clock(), counts=True)
        return report

    async def replay(self, provider: str, webhook_id: str) -> Reply:
        """Run a stored failed, released or stale delivery again through the claim and fence
        path (``receiver replay``). Raises ReplayRefused for a completed, live or unknown one."""
        return await replay(self, provider, webhook_id)

    async def enqueue_many(
        self, provider: str, deliveries: Iterable[tuple[str, bytes]], *, batch: int = 1000
    ) -> list[bool]:
        """Queue many deliveries of ``provider`` for the workers at once (a backfill, or a
        replay of events fetched from the provider's API): ``(webhook_id, body)`` pairs, trusted
        as verified (no signature is checked: the caller vouches for them). One statement per
        ``batch`` deliveries. Per delivery, in order: True if it was queued now, False if its
        webhook-id is already in the ledger (left as it is: run once, whatever the payload) or
        earlier in ``deliveries``.

        Every delivery is checked before anything is written: an unknown provider, a
        webhook-id that is not 1-255 visible ASCII, or a body that is not a JSON object with a
        valid ``"type"`` raises ValueError and records nothing. Workers (``receiver worker``,
        or ``workers=``) run them exactly like queued deliveries, whatever the provider's mode.
        """
        found = self.providers.get(provider)
        if found is None:
            raise ValueError(f"no provider named {provider!r}")
        claims = []
        for n, item in enumerate(deliveries):
            webhook_id, body = item
            if not isinstance(webhook_id, str) or not _WEBHOOK_ID.fullmatch(webhook_id):
                raise ValueError(f"delivery {n}: the webhook-id must be 1-255 visible ASCII")
            if not isinstance(body, bytes | bytearray):
                raise ValueError(f"delivery {n}: the body must be bytes")
            job = self.pipeline._prepare(found, webhook_id, bytes(body), None, self.clock())
            if job.parsed.problem is not None:
                raise ValueError(f"delivery {n} ({webhook_id}): {job.parsed.problem}")
            claims.append(job.claim)
        return await enqueue_many(
            self.store, claims, batch=batch, on_enqueued=self.pipeline.ingest.on_enqueued
        )

    def console(self, **options: Any) -> Console:
        """The operator console over this receiver's ledger, an ASGI app to mount inside the
        host application (``app.mount("/console", rx.console())``), behind the host's own
        authentication (or pass ``token=``). It replays with this receiver's handlers. Options:
        ``token``, ``read_only``, ``show_payloads``, ``actor``, ``redact_fields``
        (receiver.Console)."""
        from .._console import Console

        return Console(self.store, receiver=self, **options)

    def report_double_execution(self, event: Event, detail: str) -> None:
        """For a handler's own business check (say, its row for ``event.id`` already exists):
        count a double execution (evidence "reported") and log an alert."""
        get_logger("receiver").error(
            "ALERT: double execution reported: %s",
            detail,
            extra={"provider": event.provider, "webhook_id": event.id, "fence": event.fence},
        )
        if self.metrics is not None:
            self.metrics.double_execution(event.provider, "reported")

    # -- serving -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The webhook route, straight: a delivery to a configured provider skips the inner
        # Starlette app (its middleware and router cost a sixth of a replay, by the profile).
        # Everything else (lifespan, health, metrics, 404, 405) goes through that app.
        if scope["type"] == "http" and scope["method"] == "POST":
            provider = self.providers.get(_route_path(scope)[1:])
            if provider is not None:
                response = await self._deliver_http(Request(scope, receive), provider)
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def deliver(
        self, provider: str, headers: Headers | dict[str, str], body: bytes
    ) -> Response:
        """Process one delivery without HTTP (for tests, queues and replays)."""
        found = self.providers.get(provider)
        if found is None:
            return error(404, "unknown_provider", f"no provider named {provider!r}")
        reply = await self._traced(found, Headers(headers=dict(headers)), body)
        return reply.response

    async def _endpoint(self, request: Request) -> Response:
        provider = self.providers.get(request.path_params["provider"])
        if provider is None:
            return error(404, "unknown_provider", "no provider is configured at this path")
        if request.method != "POST":
            detail = f"webhooks are delivered with POST, not {request.method}"
            return error(405, "method_not_allowed", detail, {"allow": "POST"})
        return await self._deliver_http(request, provider)

    async def _deliver_http(self, request: Request, provider: Provider) -> Response:
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
        reply = await self._traced(provider, request.headers, body, client)
        return reply.response

    async def _traced(
        self, provider: Provider, headers: Headers, body: bytes, client: str | None = None
    ) -> Reply:
        """``pipeline.deliver`` in a span of its own when an OpenTelemetry SDK is configured."""
        if not self._opened:
            refused = await self._open_on_first_delivery()
            if refused is not None:
                return self.pipeline.unavailable(provider.name, headers, refused)
        if self._pending_startup is not None:
            starting = StoreUnavailable("the startup hooks have not run yet")
            return self.pipeline.unavailable(provider.name, headers, starting)
        tracer = self.tracing.tracer()
        if tracer is None:
            return await self.pipeline.deliver(provider, headers, body, client)
        with self.tracing.delivery(tracer, provider.name, headers) as span:
            reply = await self.pipeline.deliver(provider, headers, body, client)
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
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_size:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error(
            exc.status_code,
            codes.get(exc.status_code, "http_error"),
            exc.detail,
            exc.headers,
        )

    def __repr__(self) -> str:
        return f"Receiver(store={self.store.url!r}, providers={sorted(self.providers)!r})"
