"""Coalescing concurrent statements into one: the micro-batcher.

On PostgreSQL a delivery's cost is round trips, not work: a claim is one short INSERT, and
sixteen claims in one ``INSERT ... SELECT ... FROM unnest(...)`` cost barely more than one.
:class:`Batcher` gathers what concurrent deliveries submit and hands it to a ``flush`` function
as one list.

- A flush starts at once when none is under way, in the submitting caller's own task, so a lone
  delivery waits for nothing: at low load every batch has one item and the latency is one
  statement's.
- While a flush is in flight, submissions accumulate. Another flush starts beside it (up to
  ``max_in_flight``, each on its own connection) only once ``min_batch`` of them wait;
  otherwise they go, up to ``max_size`` at a time, when a flush returns. The busier the store,
  the larger the batches: this is group commit, with no timer anywhere. A lone small flush
  beside a running one would cost a statement's full fixed price (the Python side of a round
  trip is most of a delivery's cost on the store) for a few items: with ``min_batch`` 1 the
  benchmark's batches averaged 5 items, with 12 they averaged 11, and the same process answered
  about a third more deliveries per second (benchmarks/README.md).
- ``flush`` returns one result per item, in order; an item's result may be an exception, raised
  to that item's caller alone. An exception from ``flush`` itself fails the whole batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

#: Items that must wait before a flush starts beside one already in flight (see above).
DEFAULT_MIN_BATCH = 12

Flush = Callable[[Sequence[In]], Awaitable[Sequence[Out | BaseException]]]


class Batcher(Generic[In, Out]):
    def __init__(
        self,
        flush: Flush[In, Out],
        *,
        max_size: int = 64,
        max_in_flight: int = 4,
        min_batch: int | None = None,
    ) -> None:
        if min_batch is None:
            min_batch = DEFAULT_MIN_BATCH
        if max_size < 1 or max_in_flight < 1 or min_batch < 1:
            raise ValueError("max_size, max_in_flight and min_batch must be at least 1")
        self._flush = flush
        self.max_size = max_size
        self.max_in_flight = max_in_flight
        self.min_batch = min(min_batch, max_size)
        self._pending: list[tuple[In, asyncio.Future[Out]]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Sizes of the batches flushed so far (for tests and the benchmark), bounded.
        self.sizes: list[int] = []

    async def submit(self, item: In) -> Out:
        """Queue ``item`` for the next flush and wait for its own result."""
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        if not self._in_flight and not self._pending:
            # Idle: this item alone, flushed at once in the caller's own task (no task to
            # create and schedule: the latency at low load is the statement's own).
            self._in_flight += 1
            await self._run([(item, future)])
            return future.result()
        self._pending.append((item, future))
        self._start()
        # A caller that gives up (a client disconnect) cancels its own future only, never the
        # flush that its neighbours wait for: the flush skips futures already done.
        return await future

    def _start(self) -> None:
        while self._pending and self._in_flight < self.max_in_flight:
            if self._in_flight and len(self._pending) < self.min_batch:
                break  # the flush under way returns soon and takes these along
            batch, self._pending = self._pending[: self.max_size], self._pending[self.max_size :]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[In, asyncio.Future[Out]]]) -> None:
        try:
            if len(self.sizes) < 100_000:
                self.sizes.append(len(batch))
            try:
                results = await self._flush([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"flush returned {len(results)} results for {len(batch)} items"
                    )
            except BaseException as exc:  # the whole batch failed (store unavailable, ...)
                for _, future in batch:
                    if future.done():
                        continue
                    if isinstance(exc, Exception):
                        future.set_exception(exc)
                    else:  # cancelled (the caller that ran it alone, or shutting down)
                        future.cancel()
                if not isinstance(exc, Exception):
                    raise
                return
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        finally:
            self._in_flight -= 1
            self._start()

    async def close(self) -> None:
        """Wait for the flushes under way."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
