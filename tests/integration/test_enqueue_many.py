"""``Receiver.enqueue_many`` on both stores: many deliveries queued in one statement per batch,
each key once (against the ledger, within the call, and against a concurrent call), bad input
refused before anything is written, and the workers run each exactly once."""

from __future__ import annotations

import asyncio
import collections

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receiver import Event, Linear, Provider, Receiver, Store, sign_linear
from receiver._store.base import Connection
from tests.integration.test_queued import drain
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    SECRET,
    Clock,
    body_of,
    effects,
    receipt_count,
    signed,
)


def receiver_for(store: Store, clock: Clock) -> tuple[Receiver, list[str]]:
    store.clock = clock
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued")], clock=clock)
    ran: list[str] = []

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> None:
        ran.append(event.id)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )

    return rx, ran


async def test_many_deliveries_are_queued_once_and_run_once(store: Store) -> None:
    clock = Clock()
    rx, ran = receiver_for(store, clock)
    async with rx:
        before = await rx.enqueue_many(PROVIDER, [("m0", body_of(order=0))])
        assert before == [True]
        deliveries = [(f"m{n}", body_of(order=n)) for n in range(25)]
        deliveries.append(("m3", body_of(order=3)))  # twice in one call
        got = await rx.enqueue_many(PROVIDER, deliveries, batch=7)
        # m0 was already in the ledger; the second m3 is a duplicate of the first.
        assert got == [False] + [True] * 24 + [False]
        assert await receipt_count(store) == 25
        assert await drain(rx, concurrency=8) == {"executed": 25}
        assert sorted(ran) == sorted(f"m{n}" for n in range(25))
        assert await effects(store) == 25
        # Queued again after completion: already in the ledger, nothing runs again.
        assert await rx.enqueue_many(PROVIDER, deliveries[:3]) == [False] * 3
        assert await drain(rx, concurrency=8) == {}
        assert await effects(store) == 25


@pytest.mark.parametrize(
    ("provider", "delivery", "problem"),
    [
        ("nobody", ("x1", body_of()), "no provider"),
        (PROVIDER, ("", body_of()), "webhook-id"),
        (PROVIDER, ("has space", body_of()), "webhook-id"),
        (PROVIDER, ("x" * 256, body_of()), "webhook-id"),
        (PROVIDER, ("x1", "not bytes"), "bytes"),
        (PROVIDER, ("x1", b"not json"), "x1"),
        (PROVIDER, ("x1", b'{"no":"type"}'), "type"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_written(
    store: Store, provider: str, delivery: tuple[str, object], problem: str
) -> None:
    clock = Clock()
    rx, _ = receiver_for(store, clock)
    async with rx:
        good = [(f"ok{n}", body_of(order=n)) for n in range(3)]
        with pytest.raises(ValueError, match=problem):
            await rx.enqueue_many(provider, [*good, delivery])  # type: ignore[list-item]
        assert await receipt_count(store) == 0
        with pytest.raises(ValueError, match="batch"):
            await rx.enqueue_many(PROVIDER, good, batch=0)
        assert await receipt_count(store) == 0


async def test_concurrent_calls_queue_each_key_once(store: Store) -> None:
    """Copies of one backfill, released at once through one barrier: every key is queued by
    exactly one of them, and run once."""
    clock = Clock()
    rx, ran = receiver_for(store, clock)
    async with rx:
        deliveries = [(f"c{n}", body_of(order=n)) for n in range(40)]
        barrier = asyncio.Barrier(4)

        async def copy(shift: int) -> list[bool]:
            mine = deliveries[shift:] + deliveries[:shift]  # another order each
            await barrier.wait()
            got = await rx.enqueue_many(PROVIDER, mine, batch=16)
            return got[-shift:] + got[:-shift] if shift else got

        results = await asyncio.gather(*(copy(s) for s in (0, 10, 20, 30)))
        for n in range(40):
            assert sum(r[n] for r in results) == 1, deliveries[n][0]
        assert await receipt_count(store) == 40
        assert await drain(rx, concurrency=8) == {"executed": 40}
        assert sorted(ran) == sorted(d[0] for d in deliveries)


ids = st.sampled_from([f"h{n}" for n in range(12)])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=st.lists(ids, max_size=10),
    second=st.lists(ids, max_size=20),
    batch=st.integers(1, 8),
)
async def test_inserted_flags_match_the_ledger(
    pg_store: Store, first: list[str], second: list[str], batch: int
) -> None:
    """Whatever the ids, their repeats and the batch size: True exactly for the first copy of
    an id that was not in the ledger, and the ledger holds each id once."""
    clock = Clock()
    rx, _ = receiver_for(pg_store, clock)
    async with rx:
        async with pg_store.acquire() as conn:
            await conn.execute("DELETE FROM receiver_receipts")
        await rx.enqueue_many(PROVIDER, [(i, body_of(id=i)) for i in first], batch=batch)
        got = await rx.enqueue_many(PROVIDER, [(i, body_of(id=i)) for i in second], batch=batch)
        seen = set(first)
        expected = []
        for i in second:
            expected.append(i not in seen)
            seen.add(i)
        assert got == expected
        assert await receipt_count(pg_store) == len(seen)


async def test_a_backfill_of_delivered_events_runs_each_handler_once(store: Store) -> None:
    """Events delivered live, then backfilled with the sender's own ids (as fetched from its
    API): the backfill gets the keys the live path gave them (the provider's dedup key for a
    keyed provider, the signed body's for GitHub-like schemes), so nothing runs twice."""
    clock = Clock()
    store.clock = clock
    keyed = Provider("keyed", [SECRET], dedup_key="data.order", mode="queued")
    linear = Provider("linear", verifier=Linear([SECRET]), mode="queued")
    rx = Receiver(store, [keyed, linear], clock=clock)
    runs: collections.Counter[str] = collections.Counter()

    @rx.on("*")
    async def record(event: Event, tx: Connection) -> None:
        runs[f"{event.provider}/{event.payload['data']['order']}"] += 1

    def linear_body(order: int) -> bytes:
        payload = {"type": "order.created", "action": "create", "data": {"order": order}}
        return orjson.dumps({**payload, "webhookTimestamp": int(clock() * 1000)})

    async with rx:
        for n in range(3):  # live, each under the sender's delivery id
            body = body_of(order=n)
            answer = await rx.deliver("keyed", signed(f"msg_{n}", body, timestamp=clock()), body)
            assert answer.status_code == 202
            body = linear_body(n)
            headers = {"linear-signature": sign_linear(SECRET, body), "linear-delivery": f"d{n}"}
            assert (await rx.deliver("linear", headers, body)).status_code == 202
        assert await drain(rx, concurrency=4) == {"executed": 6}
        clock.advance(3600)
        # The backfill: the same events under the ids the sender gave them, and one new each.
        backfill = [(f"msg_{n}", body_of(order=n)) for n in range(4)]
        assert await rx.enqueue_many("keyed", backfill) == [False] * 3 + [True]
        again = [(f"d{n}", linear_body(n)) for n in range(4)]
        assert await rx.enqueue_many("linear", again) == [False] * 3 + [True]
        assert await drain(rx, concurrency=4) == {"executed": 2}
    assert runs == {f"{p}/{n}": 1 for p in ("keyed", "linear") for n in range(4)}


async def test_a_backfill_the_key_cannot_be_made_from_is_refused_whole(store: Store) -> None:
    clock = Clock()
    keyed = Provider("keyed", [SECRET], dedup_key="data.order", mode="queued")
    rx = Receiver(store, [keyed], clock=clock)
    async with rx:
        deliveries = [("m1", body_of(order=1)), ("m2", body_of(other=2))]
        with pytest.raises(ValueError, match=r"delivery 1 \(m2\): no dedup key"):
            await rx.enqueue_many("keyed", deliveries)
        assert await receipt_count(store) == 0
