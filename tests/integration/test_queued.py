"""Queued mode on both stores: the 202 at ingest and its replay, the workers' run under a
fence, retries on the backoff schedule, dead letters, and the recovery of a dead worker's
receipt."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from receiver import Backoff, Event, Provider, Receiver, State, Store
from receiver._ledger.receipts import Key, lookup
from receiver._store.base import Connection
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    SECRET,
    Clock,
    SimulatedCrash,
    body_of,
    effects,
    signed,
)

QUEUED_BODY = b'{"status":"queued"}'


def queued_receiver(
    store: Store, clock: Clock, *, retry: Backoff | None = None, lease: float = 30.0
) -> tuple[Receiver, dict[str, Any]]:
    """A receiver whose provider is queued; its ``order.*`` handler writes one effects row, and
    fails or crashes as the test says."""
    store.clock = clock
    rx = Receiver(
        store,
        [Provider(PROVIDER, [SECRET], mode="queued", retry=retry, lease=lease)],
        clock=clock,
    )
    state: dict[str, Any] = {"calls": 0, "fail": False, "crash": set()}

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> dict[str, int]:
        state["calls"] += 1
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        if event.id in state["crash"]:
            state["crash"].discard(event.id)
            raise SimulatedCrash(event.id)
        if state["fail"]:
            raise RuntimeError("downstream refused")
        return {"fence": event.fence}

    return rx, state


async def deliver(rx: Receiver, webhook_id: str, body: bytes, clock: Clock) -> Any:
    return await rx.deliver(PROVIDER, signed(webhook_id, body, timestamp=clock()), body)


async def receipt(store: Store, webhook_id: str) -> Any:
    async with store.acquire() as conn:
        return await lookup(conn, Key(PROVIDER, webhook_id), store.now())


async def drain(rx: Receiver, *, concurrency: int = 4, **options: Any) -> dict[str, int]:
    """Run a worker until nothing is due and nothing runs, then stop it."""
    worker = rx.worker(concurrency=concurrency, poll_interval=0.05, grace=5.0, **options)
    task = asyncio.create_task(worker.run())
    for _ in range(400):
        await asyncio.sleep(0.02)
        async with rx.store.acquire() as conn:
            depth = await conn.run_all("queue_depth", rx.store.now())
        if not any(r["due"] for r in depth) and not worker._running:
            break
    worker.stop()
    await task
    return worker.done


async def test_queued_delivery_is_answered_202_and_replayed(store: Store) -> None:
    clock = Clock()
    rx, state = queued_receiver(store, clock)
    async with rx:
        body = body_of(order=1)
        first = await deliver(rx, "q1", body, clock)
        assert (first.status_code, first.body) == (202, QUEUED_BODY)
        assert state["calls"] == 0  # nothing ran while the sender waited
        again = await deliver(rx, "q1", body, clock)
        assert (again.status_code, again.body) == (202, QUEUED_BODY)
        assert again.headers["idempotent-replayed"] == "true"
        other = await deliver(rx, "q1", body_of(order=2), clock)
        assert other.status_code == 422
        assert (await receipt(store, "q1")).state is State.QUEUED
        assert await drain(rx) == {"executed": 1}
        assert state["calls"] == 1
        assert await effects(store, "q1") == 1
        done = await receipt(store, "q1")
        assert done.state is State.COMPLETED
        assert done.fence == 1
        # The sender's answer stays the 202, after the worker's completion too.
        rx.pipeline.cache = None
        late = await deliver(rx, "q1", body, clock)
        assert (late.status_code, late.body) == (202, QUEUED_BODY)
        assert await drain(rx) == {}


async def test_refused_inputs_never_reach_the_queue(store: Store) -> None:
    clock = Clock()
    rx, _ = queued_receiver(store, clock)
    async with rx:
        body = body_of(order=1)
        forged = signed("q2", body, timestamp=clock(), secret="whsec_" + "A" * 32)
        assert (await rx.deliver(PROVIDER, forged, body)).status_code == 401
        assert await receipt(store, "q2") is None
        bad = await deliver(rx, "q3", b"not json", clock)
        assert bad.status_code == 400  # recorded final, as inline
        assert (await receipt(store, "q3")).state is State.FAILED


async def test_inline_and_queued_handlers_in_one_app(store: Store) -> None:
    clock = Clock()
    store.clock = clock
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], clock=clock)
    ran: list[str] = []

    @rx.on("fast.*")
    async def fast(event: Event, tx: Connection) -> dict[str, str]:
        ran.append(event.id)
        return {"inline": event.id}

    @rx.on("slow.*", mode="queued")
    async def slow(event: Event, tx: Connection) -> None:
        ran.append(event.id)

    async with rx:
        inline = await deliver(rx, "a", body_of("fast.one"), clock)
        assert (inline.status_code, orjson.loads(inline.body)) == (200, {"inline": "a"})
        queued = await deliver(rx, "b", body_of("slow.one"), clock)
        assert (queued.status_code, queued.body) == (202, QUEUED_BODY)
        assert ran == ["a"]
        await drain(rx)
        assert ran == ["a", "b"]


async def test_failures_retry_on_the_backoff_schedule_then_dead(store: Store) -> None:
    clock = Clock()
    retry = Backoff(attempts=3, base=10.0, cap=15.0, jitter=0.0)
    rx, state = queued_receiver(store, clock, retry=retry)
    state["fail"] = True
    async with rx:
        await deliver(rx, "q4", body_of(order=4), clock)
        assert await drain(rx) == {"handler_failed": 1}
        first = await receipt(store, "q4")
        assert (first.state, first.attempts) == (State.QUEUED, 1)
        assert await drain(rx) == {}  # not due yet
        async with store.acquire() as conn:
            due = await conn.fetchval(
                "SELECT due_at FROM receiver_receipts WHERE webhook_id = 'q4'"
            )
        assert _seconds(due) == pytest.approx(clock() + 10.0)
        clock.advance(10.0)
        assert await drain(rx) == {"handler_failed": 1}
        async with store.acquire() as conn:
            due = await conn.fetchval(
                "SELECT due_at FROM receiver_receipts WHERE webhook_id = 'q4'"
            )
        assert _seconds(due) == pytest.approx(clock() + 15.0)  # 20 s, capped at 15 s
        clock.advance(15.0)
        assert await drain(rx) == {"dead_letter": 1}
        dead = await receipt(store, "q4")
        assert (dead.state, dead.attempts) == (State.FAILED, 3)
        assert "downstream refused" in (dead.last_error or "")
        async with store.acquire() as conn:
            errors = await conn.run_all("list_attempts", PROVIDER, "q4")
        assert [r["fence"] for r in errors] == [1, 2, 3]
        assert state["calls"] == 3
        assert await effects(store, "q4") == 0
        # The sender still gets the 202; the dead letter is the operator's.
        rx.pipeline.cache = None
        late = await deliver(rx, "q4", body_of(order=4), clock)
        assert (late.status_code, late.body) == (202, QUEUED_BODY)
        # A replay queues it again with a fresh round of attempts.
        state["fail"] = False
        reply = await rx.replay(PROVIDER, "q4")
        assert reply.outcome.value == "queued"
        assert await drain(rx) == {"executed": 1}
        assert await effects(store, "q4") == 1


def _seconds(value: Any) -> float:
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


async def test_a_dead_workers_receipt_runs_once_more_under_the_next_fence(store: Store) -> None:
    clock = Clock()
    rx, state = queued_receiver(store, clock, lease=30.0)
    state["crash"].add("q5")
    async with rx:
        await deliver(rx, "q5", body_of(order=5), clock)
        worker = rx.worker(concurrency=1, poll_interval=0.05, stale_interval=0.05)
        task = asyncio.create_task(worker.run())
        for _ in range(100):
            await asyncio.sleep(0.02)
            if state["calls"]:
                break
        await asyncio.sleep(0.1)
        worker.stop()
        await asyncio.gather(task, return_exceptions=True)  # the crash escapes, like a kill
        stuck = await receipt(store, "q5")
        assert (stuck.state, stuck.fence) == (State.IN_FLIGHT, 1)
        assert await effects(store, "q5") == 0  # the crashed transaction rolled back
        rx.pipeline._running.clear()  # a new process: it does not know the dead attempt
        clock.advance(31.0)
        assert await drain(rx) == {"executed": 1}
        done = await receipt(store, "q5")
        assert (done.state, done.fence) == (State.COMPLETED, 2)
        async with store.acquire() as conn:
            fences = await conn.fetch("SELECT fence FROM effects WHERE webhook_id = 'q5'")
        assert [r["fence"] for r in fences] == [2]
        assert state["calls"] == 2


async def test_queue_metrics(store: Store) -> None:
    clock = Clock()
    rx, state = queued_receiver(store, clock, retry=Backoff(attempts=1, base=1.0, cap=1.0))
    state["fail"] = True
    assert rx.metrics is not None
    async with rx:
        for i in range(3):
            await deliver(rx, f"m{i}", body_of(order=i), clock)
        clock.advance(7.0)
        text = (await rx.metrics.render(store, clock())).decode()
        assert 'receiver_queue_depth{provider="acme",state="due"} 3.0' in text
        assert 'receiver_queue_oldest_due_age_seconds{provider="acme"} 7.0' in text
        assert await drain(rx) == {"dead_letter": 3}
        text = (await rx.metrics.render(store, clock())).decode()
        assert 'receiver_queue_depth{provider="acme",state="due"} 0.0' in text
        assert 'receiver_queue_dead_letters_total{provider="acme"} 3.0' in text
        assert 'receiver_queue_attempts_total{outcome="dead_letter",provider="acme"} 3.0' in text
        assert 'receiver_queue_lag_seconds_count{provider="acme"} 3.0' in text


async def test_in_process_workers_run_in_the_app_s_lifespan(store: Store) -> None:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued")], workers=2)
    ran: list[str] = []

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> None:
        ran.append(event.id)

    async with rx.lifespan():
        body = body_of(order=1)
        answer = await rx.deliver(PROVIDER, signed("in-app", body), body)
        assert answer.status_code == 202
        # Woken by its own ingest at once (no poll interval to wait out).
        for _ in range(100):
            if ran:
                break
            await asyncio.sleep(0.02)
        assert ran == ["in-app"]
    assert rx._worker is None  # stopped with the app
    assert (await receipt(store, "in-app")).state is State.COMPLETED


async def test_key_drift_is_counted_for_queued_deliveries(store: Store) -> None:
    clock = Clock()
    rx, _ = queued_receiver(store, clock)
    assert rx.metrics is not None
    async with rx:
        body = body_of(order=7)
        assert (await deliver(rx, "first-id", body, clock)).status_code == 202
        assert (await deliver(rx, "regenerated-id", body, clock)).status_code == 202
    assert rx.metrics.key_drift.labels(PROVIDER)._value.get() == 1
