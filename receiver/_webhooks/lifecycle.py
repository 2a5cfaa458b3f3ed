"""The Receiver's life: opening its store (schema check, startup hooks, retried while the store
is down), the ASGI lifespan, and the background work it runs while it serves (the sweeper and
in-process workers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from .._exceptions import (
    ConfigurationError,
    SchemaOutdated,
    StoreMisconfigured,
    StoreUnavailable,
)
from .._logging import get_logger
from .._ops.health import check_ready
from .._ops.metrics import Metrics
from .._ops.sweeper import Recoverer, SweepReport, sweep_forever
from .._store.base import Connection, Store
from .._store.migrations import check_current
from .handoff import Handoffs
from .pipeline import Pipeline
from .providers import Provider
from .sweeper import sweep
from .worker import Worker

StartupHook = Callable[[Connection], Awaitable[None]]

_INSUFFICIENT_PRIVILEGE = "42501"  # PostgreSQL's insufficient_privilege


class StartupRefused(ConfigurationError):
    """A startup hook's statement was refused for the store role's privileges (typically a
    ``CREATE TABLE`` as a role without CREATE on the schema): no retry fixes that."""


def _refused_for_privileges(exc: BaseException) -> bool:
    """Whether the driver's error (raised as it is, or translated ``from`` it) is PostgreSQL's
    insufficient_privilege."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE:
            return True
        seen = seen.__cause__
    return False


def _refusal(hook: StartupHook) -> StartupRefused:
    name = f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__name__', repr(hook))}"
    return StartupRefused(
        f"the startup hook {name} was refused for privileges (SQLSTATE 42501): the store "
        "URL's role may not run its statements; create the app's tables as their owner "
        "(`receiver migrate --config receiver.toml` applies the files in its `migrations` "
        "directory), or GRANT CREATE ON SCHEMA public TO the store URL's role"
    )


class Lifecycle:
    """Opening and closing a :class:`~receiver.Receiver`, and its background work."""

    store: Store
    pipeline: Pipeline
    providers: dict[str, Provider]
    recoverers: dict[str, Recoverer]
    metrics: Metrics | None
    clock: Callable[[], float]
    sweep_interval: float | None
    dead_letter_retention: float
    audit_retention: float
    workers: int
    _startup: list[StartupHook]
    _pending_startup: asyncio.Task[None] | None
    #: Why deliveries are refused while the startup work is pending, when it is not an outage.
    _not_ready: StoreUnavailable | None
    _opened: bool
    #: Why the lifespan failed the start-up, once it has said so in its ALERT line.
    _startup_refused: StartupRefused | None
    handoffs: Handoffs
    _sweeper: asyncio.Task[None] | None
    _worker: Worker | None
    _worker_task: asyncio.Task[None] | None

    async def open(self, *, defer_startup: bool = False) -> None:
        """Open the store, check its schema, and run the startup hooks. If the store is
        unavailable then, this raises :class:`~receiver.StoreUnavailable`; with
        ``defer_startup=True`` (what serving does) the schema check and the hooks are retried
        in the background instead, and deliveries are answered 503 until both have passed."""
        await self.store.open()
        # Never serve on an older schema: fail here, naming the missing migrations. A store
        # that is down cannot say: the check then runs when it first answers, before the hooks
        # and before any delivery (it may come back on an older schema).
        unchecked: StoreUnavailable | None = None
        try:
            await check_current(self.store)
        except StoreUnavailable as exc:
            get_logger("receiver").warning("could not check the ledger's schema: %s", exc)
            unchecked = exc
        # Loud at start-up: a missing database, table or privilege, or a read-only standby,
        # would otherwise show only as 503s once deliveries arrive. Serving starts anyway (the
        # answer is then 503, which senders retry), so that fixing the store is enough.
        problem = await check_ready(self.store)
        if problem is not None:
            get_logger("receiver").error("ALERT: the store is not ready: %s", problem)
        try:
            if unchecked is not None:
                raise unchecked
            await self._run_startup_hooks()
        except StoreUnavailable as exc:
            # Without hooks, an unchecked schema is no reason to refuse to open: deliveries
            # wait for the check (503), as they would for the store.
            if not defer_startup and (unchecked is None or self._startup):
                raise
            self._not_ready = exc
            get_logger("receiver").error(
                "ALERT: the schema check and the startup hooks could not run, the store is "
                "unavailable (%s); deliveries are answered 503 until they have run",
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
                    try:
                        await hook(conn)
                    except Exception as exc:
                        if not _refused_for_privileges(exc):
                            raise
                        # One line naming the fix, not the driver's traceback.
                        raise _refusal(hook) from None

    async def _retry_startup_hooks(self) -> None:
        logger = get_logger("receiver")
        delay = 0.25
        checked = False
        while True:
            await asyncio.sleep(delay)
            try:
                if not checked:
                    await check_current(self.store)
                    checked = True
                await self._run_startup_hooks()
            except StoreUnavailable as exc:
                self._not_ready = exc  # what deliveries are answered with meanwhile
                logger.warning("startup hooks: store unavailable (%s); retry in %.1f s", exc, delay)
            except SchemaOutdated as exc:
                # Back, but older than this version: never serve on it. Retried, so that a
                # `receiver migrate` run meanwhile is enough.
                self._not_ready = StoreMisconfigured(str(exc))
                logger.error("ALERT: %s; deliveries are answered 503", exc)
                delay = 5.0
                continue
            except StartupRefused as exc:
                self._not_ready = StoreMisconfigured(str(exc))
                logger.error("ALERT: %s; deliveries are answered 503", exc)
                delay = 30.0
                continue
            except Exception:
                # A hook's own bug: loud, and retried slowly (its fix may be in the database).
                logger.exception("ALERT: a startup hook failed; deliveries are answered 503")
                delay = 30.0
            else:
                logger.info("startup hooks ran; serving deliveries")
                self._not_ready = None
                self._pending_startup = None
                return
            delay = min(delay * 2, 5.0) if delay < 30.0 else delay

    async def close(self) -> None:
        # Deliveries answered 202 at their sender's limit finish first (for a bounded grace).
        await self.handoffs.drain()
        if self._pending_startup is not None:
            self._pending_startup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pending_startup
            self._pending_startup = None
        self._opened = False
        await self.store.close()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """An ASGI lifespan: ``Starlette(..., lifespan=rx.lifespan)``. Opens the store and runs
        the background sweeper (every ``sweep_interval`` seconds) while the app serves. A
        store that is down at start does not stop it: deliveries are answered 503 until the
        store answers and the startup hooks have run. A startup hook refused for privileges
        fails the start-up, after one ALERT line naming the GRANT."""
        try:
            await self.open(defer_startup=True)
        except StartupRefused as exc:
            self._startup_refused = exc
            get_logger("receiver").error("ALERT: the receiver cannot start: %s", exc)
            await self.store.close()
            raise
        try:
            if self.sweep_interval is not None:
                self._sweeper = asyncio.create_task(
                    self._run_sweeper(self.sweep_interval), name="receiver-sweeper"
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
        await self._started()
        await worker.run()

    async def _run_sweeper(self, interval: float) -> None:
        # The sweeper recovers stale receipts with their handlers: not before the startup
        # hooks have made their tables (nor on a schema not yet checked).
        await self._started()
        await sweep_forever(self.sweep, interval)

    async def _started(self) -> None:
        """Wait for the startup work deferred by an outage (shielded: a background task that
        stops waiting must not cancel it for everyone)."""
        if self._pending_startup is not None:
            await asyncio.shield(self._pending_startup)

    async def _stop_workers(self) -> None:
        if self._worker is not None and self._worker_task is not None:
            self._worker.stop()
            await self._worker_task
        self._worker = self._worker_task = None

    async def sweep(self, *, batch: int = 100) -> SweepReport:
        """One sweeper pass: recover or fail stale in-flight receipts, delete expired ones
        (and old audit records)."""
        now = self.store.now()
        report = await sweep(
            self.store,
            self.pipeline,
            self.providers,
            now=now,
            batch=batch,
            retention=self.dead_letter_retention,
            audit_retention=self.audit_retention,
            recoverers=self.recoverers,
        )
        if self.metrics is not None:
            await self.metrics.refresh(self.store, self.clock(), counts=True)
        return report
