"""The queued worker keeps the timing its settings promise (issue 19, item 15), on both stores:
a retry runs when it falls due, not on the next poll."""

from __future__ import annotations

import asyncio
import time

from receiver import Backoff, Event, Provider, Receiver, Store
from receiver._store.base import Connection
from tests.support import PROVIDER, SECRET, body_of, signed


async def test_a_retry_runs_when_due_not_on_the_next_poll(store: Store) -> None:
    retry = Backoff(attempts=3, base=0.2, cap=0.2, jitter=0.0)
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued", retry=retry)])
    attempts: list[float] = []

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RuntimeError("the downstream timed out")

    async with rx:
        worker = rx.worker(concurrency=2, poll_interval=5.0)  # a poll would come 5 s later
        running = asyncio.create_task(worker.run())
        body = body_of(order=1)
        assert (await rx.deliver(PROVIDER, signed("w-1", body), body)).status_code == 202
        for _ in range(200):
            if len(attempts) == 2:
                break
            await asyncio.sleep(0.02)
        worker.stop()
        await running
    assert len(attempts) == 2
    gap = attempts[1] - attempts[0]
    assert 0.15 <= gap < 1.5, gap  # due after 0.2 s; never the 5 s poll
