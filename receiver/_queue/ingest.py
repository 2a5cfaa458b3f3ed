"""Ingest micro-batching: concurrent queued deliveries share one insert per flush.

Each delivery waits for the flush that carries it, and is answered only after that flush's
statement has committed (I4: a 202 always stands for a committed receipt). A flush starts at
once when none is running, so an idle receiver adds no wait; while flushes are running, new
deliveries gather for at most ``max_wait`` seconds or until ``max_batch`` of them are waiting,
and at most ``max_flushes`` flushes run at once (each on its own connection). A batch that
fails for any reason other than the store being down is split, so that one item's problem
never fails its neighbours; the store being down fails the batch (every request answers 503,
and nothing of it was acknowledged).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from .._exceptions import StoreUnavailable
from .._ledger.receipts import Claim, Key
from .._store.base import Store
from . import receipts as queue


@dataclass(frozen=True, slots=True)
class Recorded:
    """What :meth:`Ingest.submit` did with one delivery."""

    #: True if this delivery inserted its receipt; False if the key was already there (the
    #: caller looks it up and decides, as for any duplicate).
    inserted: bool
    #: Key drift of an inserted receipt: its payload is already in the window under another
    #: webhook-id (reported by the insert statement itself).
    drift: bool = False


@dataclass(slots=True)
class _Item:
    claim: Claim
    done: asyncio.Future[Recorded] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Ingest:
    """Batches queued deliveries into the ledger: ``await submit(claim)`` says whether this
    delivery inserted its receipt (:class:`Recorded`)."""

    def __init__(
        self,
        store: Store,
        *,
        max_batch: int = 128,
        max_wait: float = 0.002,
        max_flushes: int = 4,
        on_enqueued: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_flushes = max_flushes
        #: Called after a flush inserted something (in-process workers wake up at once).
        self.on_enqueued = on_enqueued
        self._pending: list[_Item] = []
        self._flushing = 0
        self._timer: asyncio.TimerHandle | None = None
        self._waited = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Flushes done and items carried: for tests and the benchmark's batch-size figure.
        self.flushes = 0
        self.items = 0

    async def submit(self, claim: Claim) -> Recorded:
        item = _Item(claim)
        self._pending.append(item)
        self._kick()
        # A request cancelled (its client gone) cancels its own future only, never the shared
        # flush: its item is still written, as a sender's retry will expect.
        return await item.done

    def _kick(self) -> None:
        while self._pending and self._flushing < self.max_flushes:
            busy = self._flushing > 0
            if busy and len(self._pending) < self.max_batch and not self._waited:
                if self._timer is None:
                    loop = asyncio.get_running_loop()
                    self._timer = loop.call_later(self.max_wait, self._waited_enough)
                return
            self._waited = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            self._flushing += 1
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _waited_enough(self) -> None:
        self._timer = None
        self._waited = True
        self._kick()

    async def _flush(self, batch: list[_Item]) -> None:
        try:
            await self._write(batch)
        finally:
            self._flushing -= 1
            self._kick()

    async def _write(self, batch: list[_Item]) -> None:
        try:
            inserted = await self._insert([item.claim for item in batch])
        except StoreUnavailable as exc:
            _fail(batch, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            for item in batch:  # one item's problem never fails its neighbours
                await self._write([item])
            return
        self.flushes += 1
        self.items += len(batch)
        seen: set[Key] = set()
        for item in batch:
            key = item.claim.key
            # A key twice in one batch was inserted once: the first copy owns it, the others
            # are duplicates like any other.
            won = key in inserted and key not in seen
            seen.add(key)
            if not item.done.done():
                item.done.set_result(Recorded(won, won and inserted[key]))
        if inserted and self.on_enqueued is not None:
            self.on_enqueued()

    async def _insert(self, claims: list[Claim]) -> dict[Key, bool]:
        async with self.store.acquire() as conn:
            return await queue.enqueue(conn, claims, self.store.now())


def _fail(batch: list[_Item], exc: BaseException) -> None:
    for item in batch:
        if not item.done.done():
            item.done.set_exception(exc)


async def enqueue_many(
    store: Store,
    claims: list[Claim],
    *,
    batch: int = 1000,
    on_enqueued: Callable[[], None] | None = None,
) -> list[bool]:
    """Record many queued receipts at once (``Receiver.enqueue_many``): one statement per
    ``batch`` claims (PostgreSQL: one round trip and at most one NOTIFY each; SQLite: one
    transaction each), on one connection. Per claim, in order: True if it inserted its
    receipt, False if the key was already in the ledger (or earlier in ``claims``).

    Each batch commits on its own: a failure part-way (the store going down) leaves the
    batches before it recorded, and raises; calling again with the same claims records the
    rest and skips what is there."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    results: list[bool] = []
    async with store.acquire() as conn:
        for start in range(0, len(claims), batch):
            chunk = claims[start : start + batch]
            inserted = await queue.enqueue(conn, chunk, store.now())
            seen: set[Key] = set()
            for claim in chunk:
                results.append(claim.key in inserted and claim.key not in seen)
                seen.add(claim.key)
            if inserted and on_enqueued is not None:
                on_enqueued()
    return results
