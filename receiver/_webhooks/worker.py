"""Workers: run queued deliveries (docs/how-to/queued.md).

A :class:`Worker` takes due receipts in flight (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, with
the next fence and a lease: :func:`receiver._queue.receipts.fetch`) and runs each through the
pipeline exactly as an inline delivery runs: the handlers in one transaction with the fenced
completion. On PostgreSQL, up to ``group`` fetched deliveries whose handlers are all
transactional share one such transaction (:meth:`.groups.Groups.run`: one BEGIN, one
pipelined statement of completions, one COMMIT; all or nothing). Any number of worker
processes on any number of machines share one PostgreSQL; on SQLite, run one worker process
(the store has one writer anyway).

It wakes up on PostgreSQL's NOTIFY (one per ingest batch), on its own process's ingest, and
every ``poll_interval`` seconds whatever happens (a notification can be lost while the LISTEN
connection is down). It also recovers queued receipts whose worker died or stalled (in flight,
lease expired) as the sweeper recovers inline ones: transactional handlers run again under the
next fence; external ones are reconciled, never re-run blindly.

:meth:`Worker.stop` (SIGTERM in ``receiver worker``) stops fetching, lets running attempts
finish for up to ``grace`` seconds, then cancels the rest (their transactions roll back) and
makes their receipts due again at once, except those with external handlers, which are left
to the stale recovery and its reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._exceptions import StoreUnavailable
from .._ledger.receipts import Key, Receipt
from .._logging import get_logger
from .._ops.metrics import Metrics
from .._queue import receipts as queue
from .._store.base import Row, Store
from .._values import count, seconds
from .groups import QueuedAttempt
from .handlers import Registry
from .jobs import may_share
from .outcomes import Outcome
from .pipeline import Pipeline
from .providers import Provider

logger = get_logger("receiver.worker")

#: The outcome of an attempt whose end could not be stored (see Worker._left_in_flight).
LEFT_IN_FLIGHT = "left_in_flight"

#: PostgreSQL's channel: the enqueue statement sends at most one NOTIFY per batch.
CHANNEL = "receiver_queue"


class Receiver(Protocol):
    """What a worker needs of a :class:`~receiver.Receiver` (structural: no import cycle)."""

    @property
    def providers(self) -> Mapping[str, Provider]: ...
    @property
    def store(self) -> Store: ...
    @property
    def pipeline(self) -> Pipeline: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def metrics(self) -> Metrics | None: ...
    async def open(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Attempt:
    key: Key
    fence: int
    external: bool


class Worker:
    """Runs queued receipts of one Receiver, at most ``concurrency`` at once."""

    def __init__(
        self,
        rx: Receiver,
        *,
        concurrency: int = 16,
        poll_interval: float = 1.0,
        stale_interval: float = 5.0,
        grace: float = 30.0,
        group: int = 8,
    ) -> None:
        self.rx = rx
        self.concurrency = count("concurrency", concurrency)
        #: At most this many transactional deliveries share one transaction (PostgreSQL; 1:
        #: each its own; see Groups.run).
        self.group = count("group", group)
        self.poll_interval = seconds("poll_interval", poll_interval)
        self.stale_interval = seconds("stale_interval", stale_interval)
        self.grace = seconds("grace", grace, zero=True)
        self._wakeup = asyncio.Event()
        self._stopping = False
        #: Each running task and the attempts it runs (none: a stale recovery).
        self._running: dict[asyncio.Task[None], tuple[_Attempt, ...]] = {}
        #: Attempts this worker finished, by outcome (for tests and the benchmark).
        self.done: dict[str, int] = {}
        #: Attempts whose end could not be stored (the stale recovery takes them over).
        self.left_in_flight = 0

    @property
    def lease(self) -> float:
        """The lease a fetch takes: the longest any handler or provider asks for."""
        leases = [p.lease for p in self.rx.providers.values()]
        leases += [h.lease for h in self.rx.registry if h.lease is not None]
        return max(leases, default=60.0)

    def wake(self) -> None:
        self._wakeup.set()

    def stop(self) -> None:
        """Stop fetching; `run` returns once running attempts finished or were released."""
        self._stopping = True
        self._wakeup.set()

    async def open(self) -> bool:
        """Open the receiver's store, waiting out an outage: a worker started while the
        database is down or restarting waits for it (logging each try) instead of exiting.
        False if `stop` came first."""
        delay = 0.25
        while not self._stopping:
            try:
                await self.rx.open()
            except StoreUnavailable as exc:
                logger.warning(
                    "worker: store unavailable at start (%s); retrying in %.1f s", exc, delay
                )
            else:
                return True
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()
            delay = min(delay * 2, 5.0)
        return False

    async def run(self) -> None:
        listener = asyncio.create_task(self._listen(), name="receiver-worker-listen")
        stale_at = 0.0
        try:
            while not self._stopping:
                self._wakeup.clear()
                if time.monotonic() >= stale_at:
                    stale_at = time.monotonic() + self.stale_interval
                    await self._guarded(self._recover_stale())
                free = self._free()
                # Fetch when idle or when a quarter of the slots are free: not one row per
                # finished attempt.
                if free > 0 and (not self._running or free >= max(1, self.concurrency // 4)):
                    got = await self._guarded(self._fetch(free))
                    if got == free:
                        continue  # probably more due: fetch again without waiting
                # Until the next NOTIFY, the next poll, or the earliest retry falling due,
                # whichever comes first: a retry scheduled 0.2 s out runs 0.2 s out.
                wait = self.poll_interval
                if free > 0:
                    due = await self._guarded(self._next_due())
                    # (A floor: a due row another worker is fetching right now is not ours.)
                    wait = min(wait, max(due, 0.01)) if due >= 0 else wait
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wakeup.wait()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await self._drain()

    async def _guarded(self, step: Any) -> float:
        """One fetch or stale scan; a worker outlives any failure of one (the database
        restarting, a connection broken mid-statement): it logs it and polls again."""
        try:
            return float(await step)
        except StoreUnavailable as exc:
            logger.warning("worker: store unavailable (%s); retrying", exc)
        except Exception:
            logger.exception("worker: fetch failed; retrying")
        await asyncio.sleep(min(self.poll_interval, 1.0))
        return 0

    async def _next_due(self) -> float:
        """Seconds until the earliest queued receipt is due; -1 when none is queued."""
        store = self.rx.store
        async with store.acquire() as conn:
            due = await queue.next_due(conn, store.now())
        return -1.0 if due is None else due

    def _free(self) -> int:
        return self.concurrency - sum(max(1, len(a)) for a in self._running.values())

    async def _fetch(self, limit: int) -> int:
        store = self.rx.store
        async with store.acquire() as conn:
            rows = await queue.fetch(conn, store.now(), limit, self.lease)
        together: list[Row] = []
        alone: list[Row] = []
        for row in rows:
            (together if self._may_share(row) else alone).append(row)
        if len(together) < 2:
            alone, together = rows, []
        for row in alone:
            self._start(self._process(row), (_Attempt(_key(row), row["fence"], False),))
        for start in range(0, len(together), self.group):
            group = together[start : start + self.group]
            attempts = tuple(_Attempt(_key(row), row["fence"], False) for row in group)
            self._start(self._process_together(group), attempts)
        return len(rows)

    def _may_share(self, row: Row) -> bool:
        """Whether this receipt may run in a group transaction (the pipeline checks its payload
        too): PostgreSQL only (SQLite's writer already commits in groups), and handlers that
        are all transactional."""
        if self.group < 2 or self.rx.store.dialect != "postgresql":
            return False
        provider = row["provider"]
        if provider not in self.rx.providers:
            return False
        return may_share(self.rx.registry.match(provider, row["event_type"] or ""))

    def _start(self, work: Any, attempts: tuple[_Attempt, ...]) -> None:
        task = asyncio.create_task(work)
        self._running[task] = attempts
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._wakeup.set()  # a free slot

    async def _process(self, row: Row) -> None:
        key = _key(row)
        provider = self.rx.providers.get(key.provider)
        if provider is None:
            await self._unknown_provider(key, row["fence"])
            return
        handlers = self.rx.registry.match(key.provider, row["event_type"] or "")
        attempt = _Attempt(key, row["fence"], any(h.effects == "external" for h in handlers))
        self._running[asyncio.current_task()] = (attempt,)  # type: ignore[index]
        started = time.perf_counter()
        try:
            reply = await self.rx.pipeline.process(*self._attempt_of(row, provider))
        except Exception as exc:
            self._left_in_flight(row, exc, started)
            return
        self._finished_attempt(row, reply.outcome, started, reply.fence)

    def _attempt_of(self, row: Row, provider: Provider) -> QueuedAttempt:
        """What the pipeline needs to run a fetched row (and its queue lag, counted)."""
        metrics = self.rx.metrics
        if metrics is not None and row["due_at"] is not None:
            metrics.queue_lag(provider.name, max(0.0, row["now"] - row["due_at"]))
        q = queue.Queued(int(row["attempts"]), provider.retry, provider.window.window)
        body = bytes(row["request_body"] or b"")
        return (provider, row["webhook_id"], body, row["event_type"], row["fence"], q)

    async def _process_together(self, rows: list[Row]) -> None:
        """Several receipts whose handlers are all transactional, in group transactions."""
        attempts = [self._attempt_of(row, self.rx.providers[row["provider"]]) for row in rows]
        started = time.perf_counter()
        try:
            replies: list[Any] = await self.rx.pipeline.process_together(attempts)
        except Exception as exc:
            replies = [exc] * len(rows)
        # Each member's line carries the group transaction's duration: they committed together.
        for row, reply in zip(rows, replies, strict=True):
            if isinstance(reply, Exception):
                self._left_in_flight(row, reply, started)
            else:
                self._finished_attempt(row, reply.outcome, started, reply.fence)

    async def _recover_stale(self) -> int:
        store = self.rx.store
        free = self._free()
        if free <= 0:
            return 0
        async with store.acquire() as conn:
            rows = await queue.stale(conn, store.now(), free)
        for row in rows:
            self._start(self._recover(Receipt.from_row(_key(row), row)), ())
        return len(rows)

    async def _recover(self, receipt: Receipt) -> None:
        key = receipt.key
        provider = self.rx.providers.get(key.provider)
        if provider is None:
            return  # another deployment's provider: its own workers recover it
        q = queue.Queued(receipt.attempts, provider.retry, provider.window.window)
        try:
            reply = await self.rx.pipeline.recover(provider, receipt, queued=q)
        except Exception as exc:  # as in _process: the stale recovery tries again later
            logger.warning("worker: recovery failed (%s)", type(exc).__name__)
            return
        if reply is None:
            return
        logger.warning(
            "stale queued receipt recovered: %s",
            reply.outcome.value,
            extra={
                "provider": key.provider,
                "webhook_id": key.webhook_id,
                "outcome": reply.outcome.value,
                "fence": reply.fence,
            },
        )
        self._count(key.provider, reply.outcome)

    async def _unknown_provider(self, key: Key, fence: int) -> None:
        store = self.rx.store
        logger.error(
            "ALERT: queued receipt of an unconfigured provider: dead letter",
            extra={"provider": key.provider, "webhook_id": key.webhook_id},
        )
        async with store.acquire() as conn:
            await queue.retry(
                conn,
                key,
                fence,
                "its provider is not configured in this worker",
                store.now(),
                delay=0.0,
                dead=True,
                window=86400.0,
            )

    def _count(self, provider: str, outcome: Outcome) -> None:
        self.done[outcome.value] = self.done.get(outcome.value, 0) + 1
        if self.rx.metrics is not None:
            self.rx.metrics.queue_attempt(provider, outcome.value)

    def _finished_attempt(self, row: Row, outcome: Outcome, started: float, fence: Any) -> None:
        """Count an attempt that ended with ``outcome`` and write its line."""
        self._count(row["provider"], outcome)
        log_attempt(row, outcome.value, started, fence)

    def _left_in_flight(self, row: Row, exc: Exception, started: float) -> None:
        """The completion (or the retry's scheduling) could not reach the store: the receipt
        stays in flight, and the stale recovery takes it over when its lease runs out."""
        self.left_in_flight += 1
        logger.warning(
            "worker: attempt left in flight for the stale recovery (%s: %s)",
            type(exc).__name__,
            exc,
            extra={"provider": row["provider"], "webhook_id": row["webhook_id"]},
        )
        log_attempt(row, LEFT_IN_FLIGHT, started, row["fence"])

    def summary(self) -> None:
        """The line at stop: how many attempts this worker finished, by outcome."""
        counts = dict(sorted(self.done.items()))
        if self.left_in_flight:
            counts[LEFT_IN_FLIGHT] = self.left_in_flight
        # Flat fields (``executed=3``), not a mapping: a text line shows them as they are.
        logger.info("worker stopped", extra={"attempts": sum(counts.values()), **counts})

    async def _drain(self) -> None:
        """Graceful shutdown: wait for running attempts, then cancel and release the rest."""
        tasks = list(self._running)
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=self.grace)
        if not late:
            return
        attempts = [a for t in late for a in self._running.get(t, ())]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        store = self.rx.store
        for attempt in attempts:
            if attempt.external:
                continue  # external effects may have happened: the stale recovery reconciles
            with contextlib.suppress(Exception):
                async with store.acquire() as conn:
                    await queue.release(conn, attempt.key, attempt.fence, store.now())
        logger.warning("worker stopped: %d attempts cancelled after %.0f s", len(late), self.grace)

    async def _listen(self) -> None:
        """LISTEN for the ingest's NOTIFY (PostgreSQL); polling covers any gap."""
        connect = getattr(self.rx.store, "connect_alone", None)
        if connect is None:
            return
        listens = self.rx.store.listens()  # type: ignore[attr-defined]
        if listens is None:
            logger.info(
                "worker: no LISTEN (a transaction-mode pooler without listen_url, or a shared "
                "pool): polling every %.1f s",
                self.poll_interval,
            )
            return
        logger.info("worker: LISTEN on %s, and polling every %.1f s", listens, self.poll_interval)
        while True:
            conn = None
            try:
                conn = await connect()
                closed = asyncio.Event()
                conn.add_termination_listener(lambda *_, ended=closed: ended.set())
                await conn.add_listener(CHANNEL, lambda *_: self.wake())
                self.wake()  # whatever was queued while nobody listened
                await closed.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug("worker: LISTEN connection failed (%s)", type(exc).__name__)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.close(timeout=1))
            await asyncio.sleep(self.poll_interval)


def log_attempt(row: Row, outcome: str, started: float, fence: Any) -> None:
    """One line per attempt a worker ran: the receipt's key and type, how the attempt ended,
    which attempt it was, and how long it took. Never the payload."""
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        "queued attempt %s",
        outcome,
        extra={
            "provider": row["provider"],
            "webhook_id": row["webhook_id"],
            "event_type": row["event_type"] or None,
            "outcome": outcome,
            "fence": fence,
            "attempt": int(row["attempts"]) + 1,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
        },
    )


def _key(row: Row) -> Key:
    return Key(row["provider"], row["webhook_id"])
