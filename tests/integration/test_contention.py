"""Slow handlers never starve the rest, and every wait is bounded (issue 14, items 7, 8, 14).

- A handler that never touches ``tx`` holds no pooled connection (nor SQLite's write lock)
  while it runs: unrelated deliveries go through at once.
- A duplicate of a delivery this process is running gets 409 with Retry-After at once, without
  waiting for a connection or a lock.
- ``extend_lease`` works with every pooled connection taken.
- Where a wait is unavoidable (SQLite's one writer held by a handler's transaction, a pool full
  of handlers' transactions), it ends in 503 with Retry-After after the configured bound.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from receiver import Connection, Event, PostgresStore, Provider, Receiver, SQLiteStore, Store
from tests.conftest import truncate
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, effects, signed


def client_of(rx: Receiver) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://test")


def build(store: Store, gate: asyncio.Event, *, use_tx_first: bool) -> Receiver:
    """``order.slow`` waits for the gate (after a first statement through tx, or before any);
    ``order.fast`` writes one row."""
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], replay_cache=0)

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.slow")
    async def slow(event: Event, tx: Connection) -> None:
        if use_tx_first:
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
                event.provider,
                event.id,
                event.fence,
            )
        await gate.wait()

    @rx.on("order.fast")
    async def fast(event: Event, tx: Connection) -> None:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )

    return rx


async def post(client: httpx.AsyncClient, webhook_id: str, body: bytes) -> httpx.Response:
    return await client.post(f"/{PROVIDER}", content=body, headers=signed(webhook_id, body))


async def started(rx: Receiver, count: int) -> None:
    """Wait until ``count`` deliveries are running their handlers in this process."""
    for _ in range(500):
        if len(rx.pipeline._running) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {len(rx.pipeline._running)} handlers started")


async def test_slow_handlers_without_tx_hold_no_connection(pg_url: str) -> None:
    gate = asyncio.Event()
    await truncate(pg_url)
    async with PostgresStore(pg_url, max_size=2, acquire_timeout=1.0) as store:
        rx = build(store, gate, use_tx_first=False)
        await rx.open()
        try:
            async with client_of(rx) as client:
                slow = [
                    asyncio.create_task(post(client, f"slow_{i}", body_of("order.slow", n=i)))
                    for i in range(4)
                ]
                await started(rx, 4)
                began = time.monotonic()
                fast = await post(client, "fast_1", body_of("order.fast"))
                assert fast.status_code == 200
                assert time.monotonic() - began < 1.0
                dup = await post(client, "slow_0", body_of("order.slow", n=0))
                assert dup.status_code == 409
                assert int(dup.headers["retry-after"]) >= 1
                gate.set()
                assert [r.status_code for r in await asyncio.gather(*slow)] == [200] * 4
        finally:
            gate.set()
            await rx.close()


async def test_duplicates_get_409_at_once_while_the_pool_is_full(pg_url: str) -> None:
    gate = asyncio.Event()
    await truncate(pg_url)
    async with PostgresStore(pg_url, max_size=2, acquire_timeout=0.5) as store:
        rx = build(store, gate, use_tx_first=True)
        await rx.open()
        try:
            async with client_of(rx) as client:
                slow = [
                    asyncio.create_task(post(client, f"slow_{i}", body_of("order.slow", n=i)))
                    for i in range(2)
                ]
                await started(rx, 2)
                await asyncio.sleep(0.1)  # both hold their connection in their transaction
                began = time.monotonic()
                dup = await post(client, "slow_1", body_of("order.slow", n=1))
                assert dup.status_code == 409
                assert time.monotonic() - began < 0.4
                other = await post(client, "fast_1", body_of("order.fast"))
                # Bounded: the pool's acquire timeout, then 503 with Retry-After.
                assert other.status_code == 503
                assert "retry-after" in other.headers
                assert time.monotonic() - began < 3.0
                gate.set()
                assert [r.status_code for r in await asyncio.gather(*slow)] == [200, 200]
        finally:
            gate.set()
            await rx.close()


async def test_extend_lease_works_with_every_pooled_connection_taken(pg_url: str) -> None:
    await truncate(pg_url)
    async with PostgresStore(pg_url, max_size=2, acquire_timeout=1.0) as store:
        rx = Receiver(store, [Provider(PROVIDER, [SECRET])], replay_cache=0)
        both = asyncio.Barrier(2)

        @rx.on_startup
        async def create_effects(conn: Connection) -> None:
            await conn.execute(EFFECTS_DDL)

        @rx.on("order.long")
        async def long(event: Event, tx: Connection) -> None:
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
                event.provider,
                event.id,
                event.fence,
            )
            await both.wait()  # both transactions hold a pooled connection now
            await event.extend_lease(120)

        await rx.open()
        try:
            async with client_of(rx) as client:
                answers = await asyncio.gather(
                    post(client, "long_1", body_of("order.long", n=1)),
                    post(client, "long_2", body_of("order.long", n=2)),
                )
            assert [a.status_code for a in answers] == [200, 200]
            assert await effects(store) == 2
        finally:
            await rx.close()


async def test_sqlite_duplicate_in_flight_gets_409_at_once(tmp_path: object) -> None:
    gate = asyncio.Event()
    async with SQLiteStore(f"{tmp_path}/r.db", busy_timeout=5.0) as store:
        rx = build(store, gate, use_tx_first=False)
        await rx.open()
        try:
            async with client_of(rx) as client:
                first = asyncio.create_task(post(client, "slow_1", body_of("order.slow")))
                await started(rx, 1)
                began = time.monotonic()
                dup = await post(client, "slow_1", body_of("order.slow"))
                assert dup.status_code == 409
                assert "retry-after" in dup.headers
                other = await post(client, "fast_1", body_of("order.fast"))
                assert other.status_code == 200  # not queued behind the slow handler
                assert time.monotonic() - began < 1.0
                gate.set()
                assert (await first).status_code == 200
        finally:
            gate.set()
            await rx.close()


async def test_sqlite_waits_behind_a_writing_handler_end_in_503(tmp_path: object) -> None:
    gate = asyncio.Event()
    async with SQLiteStore(f"{tmp_path}/r.db", busy_timeout=0.5) as store:
        rx = build(store, gate, use_tx_first=True)
        await rx.open()
        try:
            async with client_of(rx) as client:
                first = asyncio.create_task(post(client, "slow_1", body_of("order.slow")))
                await started(rx, 1)
                await asyncio.sleep(0.1)  # its transaction holds the write lock now
                began = time.monotonic()
                other = await post(client, "fast_1", body_of("order.fast"))
                waited = time.monotonic() - began
                assert other.status_code == 503
                assert "retry-after" in other.headers
                assert 0.4 < waited < 3.0
                gate.set()
                assert (await first).status_code == 200
            # The refused delivery left nothing behind; its retry runs.
            async with client_of(rx) as client:
                assert (await post(client, "fast_1", body_of("order.fast"))).status_code == 200
        finally:
            gate.set()
            await rx.close()
