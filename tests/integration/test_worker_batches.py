"""A PostgreSQL worker's writing handlers in savepoint groups (receiver/_queue/groups.py): one
COMMIT for many attempts; a failing attempt, or one whose fence went stale, rolls back to its
own savepoint and gives back only its own claim; a worker SIGKILLed mid-group loses the whole
uncommitted group, and every delivery still commits exactly once."""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from pathlib import Path

import asyncpg

from receiver import Connection, Event, PostgresStore, Provider, Receiver, State
from receiver._ledger.receipts import Key, lookup
from tests.conftest import truncate
from tests.servers import start_worker
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of


def receiver_for(store: PostgresStore) -> tuple[Receiver, dict[str, object]]:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued")], sweep_interval=None)
    state: dict[str, object] = {"fail": set(), "stale": set(), "runs": collections.Counter()}

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> dict[str, int]:
        state["runs"][event.id] += 1  # type: ignore[index]
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            "w",
        )
        await asyncio.sleep(0)
        if event.id in state["stale"]:  # type: ignore[operator]
            # Another worker took this receipt over meanwhile (its lease ran out): the fence
            # this attempt holds is stale now.
            async with store.acquire() as other:
                await other.execute(
                    "UPDATE receiver_receipts SET fence = fence + 1 "
                    "WHERE provider = $1 AND webhook_id = $2",
                    event.provider,
                    event.id,
                )
        if event.id in state["fail"]:  # type: ignore[operator]
            raise RuntimeError("downstream refused")
        return {"fence": event.fence}

    return rx, state


async def run_worker(rx: Receiver, expected: int) -> dict[str, int]:
    worker = rx.worker(concurrency=16, poll_interval=0.05, grace=5.0)
    assert worker.groups is not None
    task = asyncio.create_task(worker.run())
    for _ in range(500):
        await asyncio.sleep(0.02)
        if sum(worker.done.values()) >= expected:
            break
    worker.stop()
    await task
    rx.last_groups = worker.groups  # type: ignore[attr-defined]
    return worker.done


async def rows_by_id(store: PostgresStore) -> dict[str, int]:
    async with store.acquire() as conn:
        rows = await conn.fetch("SELECT webhook_id, count(*) AS n FROM effects GROUP BY 1")
    return {r["webhook_id"]: int(r["n"]) for r in rows}


async def test_a_failing_attempt_undoes_only_its_own_savepoint(pg_store: PostgresStore) -> None:
    rx, state = receiver_for(pg_store)
    ids = [f"w{n}" for n in range(40)]
    failing = {"w3", "w17", "w30"}
    state["fail"] = failing
    async with rx:
        await rx.enqueue_many(PROVIDER, [(i, body_of(order=n)) for n, i in enumerate(ids)])
        done = await run_worker(rx, len(ids))
        groups = rx.last_groups  # type: ignore[attr-defined]
        assert any(size > 1 for size in groups.sizes), groups.sizes  # one COMMIT, many attempts
        assert done == {"executed": 37, "handler_failed": 3}
        assert await rows_by_id(pg_store) == {i: 1 for i in ids if i not in failing}
        async with pg_store.acquire() as conn:
            for i in ids:
                receipt = await lookup(conn, Key(PROVIDER, i), None)
                assert receipt is not None
                if i in failing:
                    # Its own claim given back for a later retry, with the error kept.
                    assert receipt.state is State.QUEUED
                    assert receipt.attempts == 1
                    assert receipt.last_error is not None
                else:
                    assert receipt.state is State.COMPLETED


async def test_a_stale_fence_in_a_group_rolls_back_its_own_writes(
    pg_store: PostgresStore,
) -> None:
    rx, state = receiver_for(pg_store)
    ids = [f"s{n}" for n in range(24)]
    state["stale"] = {"s5", "s11"}
    async with rx:
        await rx.enqueue_many(PROVIDER, [(i, body_of(order=n)) for n, i in enumerate(ids)])
        done = await run_worker(rx, len(ids))
        assert done == {"executed": 22, "lease_lost": 2}
        # The fenced-out attempts' rows rolled back with their savepoints; the rest stand.
        assert await rows_by_id(pg_store) == {i: 1 for i in ids if i not in {"s5", "s11"}}


async def test_a_worker_killed_mid_group_keeps_every_delivery_once(
    pg_url: str, tmp_path: Path
) -> None:
    """tests/apps/queued.py SIGKILLs its worker inside "doomed"'s handler, while the group
    holding it (and whichever neighbours joined it) is uncommitted: all of it is lost, the
    next worker runs those deliveries again under the next fence, and each commits once."""
    await truncate(pg_url)
    invocations = tmp_path / "invocations"
    ids = [f"k{n}" for n in range(30)]
    ids.insert(12, "doomed")
    store = PostgresStore(pg_url, max_size=4)
    async with Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued")]) as rx:
        assert all(await rx.enqueue_many(PROVIDER, [(i, body_of(order=1)) for i in ids]))
    env = {
        "RECEIVER_STORE": pg_url,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        "RECEIVER_TEST_CRASH_IDS": "doomed",
        "RECEIVER_TEST_LEASE": "1",
    }
    log = tmp_path / "worker.log"
    first = start_worker(env, log, concurrency=16)
    try:
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
    second = start_worker(env, log, concurrency=16)
    try:
        conn = await asyncpg.connect(pg_url)
        try:
            deadline = time.monotonic() + 30
            while await conn.fetchval(
                "SELECT count(*) FROM receiver_receipts WHERE state = 'completed'"
            ) < len(ids):
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.1)
            rows = await conn.fetch("SELECT webhook_id, fence FROM effects")
        finally:
            await conn.close()
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    committed = collections.Counter(r["webhook_id"] for r in rows)
    assert committed == {i: 1 for i in ids}
    ran = collections.Counter(line.split()[0] for line in invocations.read_text().splitlines())
    assert ran["doomed"] == 2  # killed once, then run again under the next fence
    fences = {r["webhook_id"]: r["fence"] for r in rows}
    assert fences["doomed"] == 2
