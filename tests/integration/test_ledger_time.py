"""The ledger's time is the database's (issue 14, items 2 and 3).

Two replicas whose clocks differ by more than a lease must not take over each other's live
leases: leases and expiry are judged by the database's clock, and each replica's own clock only
checks signature timestamps and ages its replay cache. And a live lease always wins over
expiry: a window shorter than the lease is refused at start-up, and even a row whose window has
passed (extend_lease past it, or a window made by hand) is never taken over while its lease
runs.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from receiver import (
    ConfigurationError,
    Connection,
    Event,
    PostgresStore,
    Provider,
    Receiver,
    SQLiteStore,
    Store,
)
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Decision, Key, State
from receiver._verification.payload import parse
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, Clock, body_of, effects, signed

SKEW = 75.0  # more than the lease
LEASE = 60.0


class Skewed:
    """A replica's wall clock, ``offset`` seconds off the real one."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.time() + self.offset


def replica(store: Store, offset: float, gate: asyncio.Event, runs: list[int]) -> Receiver:
    # Each replica signs-checks with its own (skewed) clock; the stores have no clock of their
    # own, so the ledger uses the database's.
    rx = Receiver(
        store,
        [Provider(PROVIDER, [SECRET], lease=LEASE, tolerance=3600)],
        clock=Skewed(offset),
        replay_cache=0,
    )

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def handler(event: Event, tx: Connection) -> dict[str, int]:
        runs.append(event.fence)
        # Waits before writing: on SQLite a write would hold the only write lock, and the other
        # replica would wait for it instead of showing what it decides.
        await gate.wait()
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        return {"fence": event.fence}

    return rx


def client_of(rx: Receiver) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://test")


@pytest.fixture
async def two_stores(store: Store, store_url: str, tmp_path: object) -> tuple[Store, Store]:
    """A second, independent store object on the same database: another replica."""
    other: Store
    if isinstance(store, PostgresStore):
        other = PostgresStore(store_url, max_size=5)
    else:
        assert isinstance(store, SQLiteStore)
        other = SQLiteStore(store.path)
    async with other:
        yield store, other  # type: ignore[misc]


async def test_a_replica_whose_clock_is_ahead_never_takes_over_a_live_lease(
    two_stores: tuple[Store, Store],
) -> None:
    behind_store, ahead_store = two_stores
    gate, runs = asyncio.Event(), []
    behind = replica(behind_store, 0.0, gate, runs)
    ahead = replica(ahead_store, SKEW, gate, runs)
    await behind.open()
    await ahead.open()
    body = body_of()
    try:
        async with client_of(behind) as first_client, client_of(ahead) as second_client:
            first = asyncio.create_task(
                first_client.post(f"/{PROVIDER}", content=body, headers=signed("msg_1", body))
            )
            for _ in range(500):
                if runs:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            second = await second_client.post(
                f"/{PROVIDER}", content=body, headers=signed("msg_1", body)
            )
            assert second.status_code == 409, second.text
            # The replica ahead sweeps too: the lease is live by the database's clock.
            report = await ahead.sweep()
            assert (report.recovered, report.failed, report.released) == (0, 0, 0)
            gate.set()
            assert (await first).status_code == 200
    finally:
        gate.set()
        await ahead.close()
        await behind.close()
    assert runs == [1]
    assert await effects(behind_store) == 1


async def test_an_external_handler_is_not_marked_for_review_by_a_replica_ahead(
    two_stores: tuple[Store, Store],
) -> None:
    behind_store, ahead_store = two_stores
    started, gate = asyncio.Event(), asyncio.Event()

    def build(store: Store, offset: float) -> Receiver:
        rx = Receiver(
            store,
            [Provider(PROVIDER, [SECRET], lease=LEASE, tolerance=3600)],
            clock=Skewed(offset),
            replay_cache=0,
        )

        @rx.on("order.created", effects="external")
        async def call_out(event: Event, tx: Connection) -> None:
            started.set()
            await gate.wait()

        return rx

    behind, ahead = build(behind_store, 0.0), build(ahead_store, SKEW)
    await behind.open()
    await ahead.open()
    body = body_of()
    try:
        async with client_of(behind) as c1, client_of(ahead) as c2:
            first = asyncio.create_task(
                c1.post(f"/{PROVIDER}", content=body, headers=signed("msg_1", body))
            )
            await started.wait()
            second = await c2.post(f"/{PROVIDER}", content=body, headers=signed("msg_1", body))
            assert second.status_code == 409
            assert (await ahead.sweep()).failed == 0
            gate.set()
            assert (await first).status_code == 200
    finally:
        gate.set()
        await ahead.close()
        await behind.close()


def claim_of(webhook_id: str, now: float, lease: float, window: float) -> Claim:
    body = body_of()
    return Claim(
        Key(PROVIDER, webhook_id), parse(body, None).payload_hash, "x", body, now, lease, window
    )


async def test_a_live_lease_wins_over_expiry(store: Store) -> None:
    """A row whose window ended while its attempt still holds the lease is not taken over."""
    clock = Clock()
    async with store.acquire() as conn:
        got = await ledger.claim(conn, claim_of("msg_1", clock.now, lease=60, window=10))
        assert isinstance(got, ledger.Claimed)
        later = claim_of("msg_1", clock.now + 20, lease=60, window=10)
        assert await ledger.reclaim(conn, later, got.fence) is None
        found = await ledger.lookup(conn, Key(PROVIDER, "msg_1"), clock.now + 20)
        assert found is not None
        assert ledger.decide(found, later.payload_hash) is Decision.IN_FLIGHT
        # Once the lease is over too, the expired row is free again.
        past = claim_of("msg_1", clock.now + 61, lease=60, window=10)
        assert await ledger.reclaim(conn, past, got.fence) == got.fence + 1


async def test_extending_a_lease_past_the_window_keeps_the_key(store: Store) -> None:
    clock = Clock()
    key = Key(PROVIDER, "msg_1")
    async with store.acquire() as conn:
        got = await ledger.claim(conn, claim_of("msg_1", clock.now, lease=60, window=3600))
        assert isinstance(got, ledger.Claimed)
        await ledger.extend_lease(conn, key, got.fence, clock.now + 3000, 7200)
        found = await ledger.lookup(conn, key, clock.now + 3700)
        assert found is not None
        assert found.state is State.IN_FLIGHT
        assert found.expires_at >= found.lease_until
        again = claim_of("msg_1", clock.now + 3700, lease=60, window=3600)
        assert ledger.decide(found, again.payload_hash) is Decision.IN_FLIGHT
        assert await ledger.reclaim(conn, again, got.fence) is None


async def test_the_database_clock_is_used_without_an_injected_one(store: Store) -> None:
    assert store.clock is None
    async with store.acquire() as conn:
        got = await ledger.claim(conn, claim_of("msg_1", None, lease=60, window=3600))
    assert isinstance(got, ledger.Claimed)
    assert got.now == pytest.approx(time.time(), abs=5)


def test_a_window_shorter_than_the_lease_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="shorter than the lease"):
        Provider(PROVIDER, [SECRET], schedule=[0], ttl=10, lease=60)


def test_a_handler_lease_longer_than_a_window_is_a_configuration_error(tmp_path: object) -> None:
    rx = Receiver(
        SQLiteStore(f"{tmp_path}/r.db"),
        [Provider(PROVIDER, [SECRET], schedule=[0], ttl=120, lease=60)],
    )
    with pytest.raises(ConfigurationError, match="outlasts the dedup window"):
        rx.add_handler("x", lambda event, tx: None, lease=600)  # type: ignore[arg-type,return-value]


def test_derived_windows_are_at_least_an_hour() -> None:
    assert Provider(PROVIDER, [SECRET], schedule=[0], review_margin=0).window.window == 3600
