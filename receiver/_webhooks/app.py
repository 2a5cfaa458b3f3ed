"""The Receiver: an ASGI app serving ``POST /{provider}``, with handlers registered by decorator.

Its configuration and operations are here; opening, closing and its background work are
:mod:`.lifecycle`, and serving over HTTP :mod:`.serving`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from .._exceptions import ConfigurationError, StoreUnavailable, VerificationError
from .._ledger.cache import ReplayCache
from .._ledger.results import Encoder
from .._logging import get_logger
from .._ops.forwarded import TrustedProxies
from .._ops.health import observability_routes, reserved_names
from .._ops.metrics import Metrics
from .._ops.sweeper import AUDIT_RETENTION, DEAD_LETTER_RETENTION, Recoverer, check_retention
from .._queue.ingest import enqueue_many
from .._store.base import Store
from .._store.url import store_from_url
from .._values import sweep_interval as checked_interval
from .._verification.keys import key_of
from .admission import DEFAULT_MAX_WAIT, Admission
from .events import Event
from .handlers import Effects, Handler, HandlerFunc, Mode, ReconcileFunc, Registry
from .handoff import Handoffs
from .lifecycle import StartupHook
from .outcomes import Reply
from .pipeline import Pipeline
from .providers import Provider
from .replay import replay
from .serving import Serving
from .timespans import as_seconds
from .tracing import Tracing
from .worker import Worker

if TYPE_CHECKING:
    from .._console import Console

F = TypeVar("F", bound=HandlerFunc)

DEFAULT_STORE = "sqlite:///receiver.db"
DEFAULT_MAX_BODY = 1024 * 1024
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]
# What a verified webhook-id is (receiver/_verification/schemes.py): 1-255 visible ASCII.
_WEBHOOK_ID = re.compile(r"[\x21-\x7e]{1,255}")


class Receiver(Serving):
    """Receive webhooks so that each event takes effect once.

    ```python
    rx = Receiver(store="postgresql://localhost/app", providers=[Provider("acme", [secret])])

    @rx.on("invoice.paid")
    async def paid(event, tx):
        invoice = event.payload["data"]["id"]  # Standard Webhooks: the event's data
        await tx.execute("UPDATE invoices SET paid = true WHERE id = $1", invoice)

    app.mount("/webhooks", rx)   # POST /webhooks/acme
    ```

    Served alone (``uvicorn module:rx``) the store opens in the ASGI lifespan. Mounted into
    another app, it opens on the first delivery, or use ``lifespan=rx.lifespan`` (or
    ``async with rx:``) in the host application to open and close it with the app.

    ``encoder`` turns what a handler returns into JSON where it is not already (Decimal,
    dataclasses, datetimes, UUIDs, enums and Pydantic models need none). The sweeper keeps a
    dead letter ``dead_letter_retention`` seconds after its window (7 days) and an operator's
    audit record ``audit_retention`` seconds (365 days).

    Admission control: at most ``max_in_progress`` deliveries are in progress in this process
    (None: derived from the store's pool size and the measured latency, what keeps the process
    saturated; 0: no bound). Past it a delivery waits for a place while its sender's budget
    (``Provider.timeout``) lasts, ``max_queue_wait`` for a sender without one; once the oldest
    waiting has waited ``max_queue_wait``, freed places go to the newest. A delivery that gets
    no place in time, or that has waited past its sender's time limit, is answered 503 with
    ``Retry-After`` (or the provider's ``shed_status``) before anything is claimed: the
    sender's retry runs it fresh.
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
        dead_letter_retention: float = DEAD_LETTER_RETENTION,
        audit_retention: float = AUDIT_RETENTION,
        max_in_progress: int | None = None,
        max_queue_wait: float = DEFAULT_MAX_WAIT,
    ) -> None:
        self.store: Store = store_from_url(store) if isinstance(store, str) else store
        #: The bound on deliveries in progress in this process (receiver/_webhooks/admission.py).
        self.admission = Admission(
            pool=self.store.concurrency, limit=max_in_progress, max_wait=max_queue_wait
        )
        if isinstance(max_body_size, bool) or not isinstance(max_body_size, int):
            raise ConfigurationError(f"max_body_size is a number of bytes, not {max_body_size!r}")
        if max_body_size <= 0:
            raise ConfigurationError(f"max_body_size must be positive, not {max_body_size}")
        self.max_body_size = max_body_size
        # Sent as the Retry-After header of 409 and 503 answers: whole seconds, as the
        # configuration file's retry_after; a string or None was accepted, then every
        # duplicate got a 500 instead of its 409.
        if isinstance(retry_after, bool) or not isinstance(retry_after, int):
            raise ConfigurationError(
                f"retry_after is whole seconds (the Retry-After header), not {retry_after!r}"
            )
        as_seconds(retry_after, "retry_after")  # >= 0, at most two years
        self.sweep_interval = checked_interval(sweep_interval)  # None: no background sweeper
        self.dead_letter_retention = check_retention("dead_letter_retention", dead_letter_retention)
        self.audit_retention = check_retention("audit_retention", audit_retention)
        self.clock = clock
        # Whose X-Forwarded-For / X-Real-IP to believe for event.client
        # (receiver/_ops/forwarded.py).
        self.trusted_proxies = TrustedProxies(trusted_proxies)
        self._sweeper: asyncio.Task[None] | None = None
        #: Inline deliveries answered 202 at their sender's limit, still running
        #: (receiver/_webhooks/handoff.py); closing waits for them.
        self.handoffs = Handoffs()
        # Who recovers the stale claims of keys that are not webhook-ids, by namespace
        # (receiver/_ledger/keyed.py): the action executor registers itself here.
        self.recoverers: dict[str, Recoverer] = {}
        # Prometheus metrics (rx.metrics.registry), GET /metrics, /healthz and /readyz.
        self.metrics: Metrics | None = Metrics(registry) if metrics else None
        routes = observability_routes(self.store, self.metrics, metrics_path, health, clock)
        self._reserved = reserved_names(routes)
        self.providers: dict[str, Provider] = {}
        self.registry = Registry()
        for provider in providers:
            self.add_provider(provider)
        self._startup: list[StartupHook] = []
        #: Startup hooks that met the store down: retried until they have run, and deliveries
        #: are answered 503 meanwhile (a handler must not run before its tables exist).
        self._pending_startup: asyncio.Task[None] | None = None
        self._not_ready: StoreUnavailable | None = None
        #: Opened by the lifespan, ``async with rx:``, or else the first delivery (a Receiver
        #: mounted where no lifespan reaches it still runs its startup hooks first).
        self._opened = False
        self._startup_refused = None
        self._open_lock = asyncio.Lock()
        if isinstance(replay_cache, bool) or not isinstance(replay_cache, int) or replay_cache < 0:
            raise ConfigurationError(
                f"replay_cache must be a number of receipts >= 0 (0 disables it), not "
                f"{replay_cache!r}"
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
        for handler in self.registry:  # registered before this provider: checked now
            if handler.lease is not None and handler.provider in (None, provider.name):
                _lease_fits(provider, handler.lease, handler.func.__qualname__)
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
                if provider is None or p.name == provider:
                    _lease_fits(p, lease, getattr(func, "__qualname__", repr(func)))
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
        """Decorator form of `add_handler`."""

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

    async def __aenter__(self) -> Receiver:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def replay(self, provider: str, webhook_id: str) -> Reply:
        """Run a stored failed, released or stale delivery again through the claim and fence
        path (``receiver replay``); a stale one with external handlers is reconciled (or held
        for review), never run again blindly. Raises ReplayRefused for a completed, live or
        unknown one."""
        return await replay(self, provider, webhook_id)

    async def enqueue_many(
        self, provider: str, deliveries: Iterable[tuple[str, bytes]], *, batch: int = 1000
    ) -> list[bool]:
        """Queue many deliveries of ``provider`` for the workers at once (a backfill, or a
        replay of events fetched from the provider's API): ``(webhook_id, body)`` pairs, trusted
        as verified (no signature is checked: the caller vouches for them). One statement per
        ``batch`` deliveries. Per delivery, in order: True if it was queued now, False if its
        key is already in the ledger (left as it is: run once, whatever the payload) or
        earlier in ``deliveries``.

        Each delivery gets the key a live delivery of the same body gets: the provider's
        ``dedup_key`` if it has one, else its scheme's: the sender's event id, read from the
        body where the sender signs it there (Stripe, Slack, Paddle, Zoom; a digest of the
        payload for Linear), else the webhook-id given here, which must be the id the sender
        sent in its header (Standard Webhooks' webhook-id, GitHub's X-GitHub-Delivery,
        Shopify's X-Shopify-Event-Id, Twilio's I-Twilio-Idempotency-Token). So a backfill of
        events already delivered live finds their receipts and runs nothing twice.

        Every delivery is checked before anything is written: an unknown provider, a
        webhook-id that is not 1-255 visible ASCII, a body the provider's key cannot be made
        from, or a body that is not a JSON object with a valid ``"type"`` raises ValueError
        and records nothing. Workers (``receiver worker``, or ``workers=``) run them exactly
        like queued deliveries, whatever the provider's mode.
        """
        found = self.providers.get(provider)
        if found is None:
            raise ValueError(f"no provider named {provider!r}")
        jobs = []
        for n, item in enumerate(deliveries):
            webhook_id, body = item
            if not isinstance(webhook_id, str) or not _WEBHOOK_ID.fullmatch(webhook_id):
                raise ValueError(f"delivery {n}: the webhook-id must be 1-255 visible ASCII")
            if not isinstance(body, bytes | bytearray):
                raise ValueError(f"delivery {n}: the body must be bytes")
            try:
                # The key a live delivery of this body gets: one event, one key, whatever path.
                key = key_of(found.verifier, bytes(body), webhook_id)
            except VerificationError as exc:
                raise ValueError(f"delivery {n} ({webhook_id}): no dedup key: {exc}") from None
            job = self.pipeline._prepare(found, key, bytes(body), None, self.clock())
            if job.parsed.problem is not None:
                raise ValueError(f"delivery {n} ({webhook_id}): {job.parsed.problem}")
            jobs.append(job)
        # An event received before its scheme keyed on the sender's id keeps its receipt.
        claims = [(await self.pipeline.legacy.rekey(found, job)).claim for job in jobs]
        return await enqueue_many(
            self.store, claims, batch=batch, on_enqueued=self.pipeline.ingest.on_enqueued
        )

    def console(self, **options: Any) -> Console:
        """The operator console over this receiver's ledger, an ASGI app to mount inside the
        host application (``app.mount("/console", rx.console())``), behind the host's own
        authentication (or pass ``token=`` or ``operators=``). It replays with this receiver's
        handlers. Options: ``token``, ``operators``, ``read_only``, ``show_payloads``, ``actor``,
        ``redact_fields``, ``bulk_rate`` (receiver.Console)."""
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

    def __repr__(self) -> str:
        return f"Receiver(store={self.store.url!r}, providers={sorted(self.providers)!r})"


def _lease_fits(provider: Provider, lease: float, handler: str) -> None:
    """A receipt must not expire while an attempt still holds it."""
    if provider.window.window < lease:
        raise ConfigurationError(
            f"handler {handler}: its lease ({lease:g} s) outlasts the dedup window of provider "
            f"{provider.name!r} ({provider.window.window:g} s); a receipt must not expire while "
            "an attempt still holds it: lower the lease or raise the provider's ttl"
        )
