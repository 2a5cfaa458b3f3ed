"""The micro-batcher: a lone item flushes at once; under load, items coalesce; each item gets
its own result or exception; a failing flush fails its batch only."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from receiver._ledger.batcher import Batcher


class Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.gate = asyncio.Event()
        self.gate.set()

    async def flush(self, items: Sequence[int]) -> Sequence[int | BaseException]:
        self.batches.append(list(items))
        await self.gate.wait()
        await asyncio.sleep(self.delay)
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]


async def test_a_lone_item_is_flushed_at_once() -> None:
    rec = Recorder()
    batcher = Batcher(rec.flush, max_in_flight=2)
    assert await asyncio.wait_for(batcher.submit(1), 1) == 10
    assert rec.batches == [[1]]


async def test_an_idle_batchers_flush_runs_in_the_callers_own_task() -> None:
    """At low load no task is created per flush: the latency is the statement's own."""
    tasks: list[asyncio.Task[object] | None] = []

    async def flush(items: Sequence[int]) -> Sequence[int]:
        tasks.append(asyncio.current_task())
        return list(items)

    batcher = Batcher(flush)
    caller = asyncio.create_task(batcher.submit(7))
    assert await caller == 7
    assert tasks == [caller]


async def test_items_coalesce_while_every_slot_is_busy() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = Batcher(rec.flush, max_size=64, max_in_flight=1)
    first = asyncio.create_task(batcher.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(batcher.submit(i)) for i in range(1, 101)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 0
    assert [await t for t in rest] == [i * 10 for i in range(1, 101)]
    assert rec.batches[0] == [0]
    assert [len(b) for b in rec.batches[1:]] == [64, 36]
    assert sorted(i for b in rec.batches for i in b) == list(range(101))


async def test_several_flushes_run_at_once_up_to_the_limit() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = Batcher(rec.flush, max_in_flight=3, min_batch=1)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(10)]
    await asyncio.sleep(0.01)
    assert len(rec.batches) == 3  # three in flight, the rest waiting together
    rec.gate.set()
    await asyncio.gather(*tasks)
    assert len(rec.batches) == 4
    assert rec.batches[3] == [3, 4, 5, 6, 7, 8, 9]


async def test_an_items_exception_is_its_own() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = Batcher(rec.flush, max_in_flight=1)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in (1, -2, 3)]
    await asyncio.sleep(0)
    rec.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == 10
    assert isinstance(results[1], ValueError)
    assert results[2] == 30


async def test_a_failing_flush_fails_its_batch_and_the_next_one_runs() -> None:
    calls = 0

    async def flush(items: Sequence[int]) -> Sequence[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("store gone")
        return list(items)

    batcher = Batcher(flush, max_in_flight=1)
    with pytest.raises(ConnectionError):
        await batcher.submit(1)
    assert await batcher.submit(2) == 2


async def test_a_cancelled_caller_does_not_cancel_its_neighbours() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = Batcher(rec.flush, max_in_flight=1)
    first = asyncio.create_task(batcher.submit(1))
    second = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0)
    first.cancel()
    rec.gate.set()
    assert await second == 20
    assert rec.batches == [[1, 2]] or rec.batches == [[1], [2]]


async def test_a_second_flush_starts_beside_the_first_only_for_a_full_enough_batch() -> None:
    """A few items wait for the flush under way rather than pay a statement of their own; once
    ``min_batch`` wait, a second flush starts beside it."""
    rec = Recorder()
    rec.gate.clear()
    batcher = Batcher(rec.flush, max_in_flight=3, min_batch=4)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(4)]
    await asyncio.sleep(0.01)
    assert rec.batches == [[0]]  # 1, 2, 3 wait: three are fewer than min_batch
    tasks.append(asyncio.create_task(batcher.submit(4)))
    await asyncio.sleep(0.01)
    assert rec.batches == [[0], [1, 2, 3, 4]]
    tasks += [asyncio.create_task(batcher.submit(i)) for i in range(5, 7)]
    await asyncio.sleep(0.01)
    assert len(rec.batches) == 2
    rec.gate.set()
    assert await asyncio.gather(*tasks) == [i * 10 for i in range(7)]
    assert rec.batches[2] == [5, 6]  # taken along when a flush returned: nothing is left behind


async def test_when_nothing_is_in_flight_even_one_item_goes_at_once() -> None:
    rec = Recorder()
    batcher = Batcher(rec.flush, max_in_flight=4, min_batch=12)
    for i in range(3):
        assert await asyncio.wait_for(batcher.submit(i), 1) == i * 10
    assert rec.batches == [[0], [1], [2]]


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Batcher(Recorder().flush, max_in_flight=0)
    with pytest.raises(ValueError, match="at least 1"):
        Batcher(Recorder().flush, min_batch=0)
