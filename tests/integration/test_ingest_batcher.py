"""The ingest micro-batcher: concurrent queued deliveries share one insert per flush, each is
answered after its own batch commits, and duplicates (inside one batch or across batches) are
decided like any duplicate."""

from __future__ import annotations

import asyncio
import collections
import random

from receiver import PostgresStore, Provider, Receiver, Store
from receiver._ledger.receipts import Claim, Key
from receiver._queue.ingest import Ingest
from tests.support import PROVIDER, SECRET, body_of, query, signed

QUEUED = b'{"status":"queued"}'


def queued(store: Store) -> Receiver:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued")], replay_cache=0)

    @rx.on("order.*")
    async def never(event: object, tx: object) -> None:
        raise AssertionError("no handler runs at ingest")

    return rx


async def test_100_copies_of_one_delivery_race_through_one_barrier(
    pg_store: PostgresStore, pg_url: str
) -> None:
    rx = queued(pg_store)
    body = body_of(order=1)
    headers = signed("race", body)
    barrier = asyncio.Barrier(100)

    async def copy() -> tuple[int, bytes, str | None]:
        await barrier.wait()
        answer = await rx.deliver(PROVIDER, headers, body)
        return answer.status_code, bytes(answer.body), answer.headers.get("idempotent-replayed")

    async with rx:
        answers = await asyncio.gather(*(copy() for _ in range(100)))
    assert {(status, content) for status, content, _ in answers} == {(202, QUEUED)}
    assert sorted(replayed or "fresh" for _, _, replayed in answers) == ["fresh"] + ["true"] * 99
    rows = await query(pg_url, "SELECT state, fence FROM receiver_receipts")
    assert rows == [("queued", 0)]
    ingest = rx.pipeline.ingest
    assert ingest.flushes < 100  # they shared statements
    assert ingest.items == 100


async def test_mixed_ids_with_duplicates_and_mismatches(store: Store) -> None:
    rx = queued(store)
    rng = random.Random(5)
    ids = [f"m{i}" for i in range(60)]
    sends = ids + [rng.choice(ids) for _ in range(60)]
    rng.shuffle(sends)
    # One id is also sent with another payload: 422 for whichever copy comes second.
    mismatched = ids[0]
    barrier = asyncio.Barrier(len(sends) + 1)

    async def send(webhook_id: str, order: str) -> tuple[str, int, str | None]:
        body = body_of(order=order)
        headers = signed(webhook_id, body)
        await barrier.wait()
        answer = await rx.deliver(PROVIDER, headers, body)
        return webhook_id, answer.status_code, answer.headers.get("idempotent-replayed")

    async with rx:
        jobs = [send(i, i) for i in sends] + [send(mismatched, "other")]
        answers = await asyncio.gather(*jobs)
    fresh = collections.Counter(
        i for i, status, replayed in answers if status == 202 and not replayed
    )
    assert fresh == collections.Counter(ids)
    # Whichever payload of the mismatched id came first owns it; the other copies get 422.
    losers = {1, sends.count(mismatched)}
    statuses = collections.Counter(status for _, status, _ in answers)
    assert statuses[422] in losers
    assert statuses[202] + statuses[422] == len(sends) + 1
    async with store.acquire() as conn:
        n = await conn.fetchval("SELECT count(*) FROM receiver_receipts WHERE state = 'queued'")
    assert n == len(ids)
    if store.dialect == "postgresql":
        assert rx.pipeline.ingest.flushes < len(sends)


async def test_one_bad_item_never_fails_its_neighbours(pg_store: PostgresStore) -> None:
    """No input that passes verification and parsing fails its row (webhook-ids and event types
    are checked strictly before), so the bad item is built by hand: an event type with a NUL,
    which PostgreSQL text cannot hold. Its batch fails; the batcher retries each item alone."""
    ingest = Ingest(pg_store, max_flushes=1)
    claims = [claim(f"ok{i}", "order.created") for i in range(6)]
    claims.insert(3, claim("bad", "order.\x00"))
    barrier = asyncio.Barrier(len(claims))

    async def submit(c: Claim) -> bool | str:
        await barrier.wait()
        try:
            return (await ingest.submit(c)).inserted
        except Exception as exc:
            return type(exc).__name__

    results = await asyncio.gather(*(submit(c) for c in claims))
    assert results[3] not in (True, False)  # that one item failed ...
    assert results[:3] + results[4:] == [True] * 6  # ... and only that one
    assert ingest.flushes < len(claims)  # the first flush went alone, the rest together


def claim(webhook_id: str, event_type: str) -> Claim:
    body = body_of(event_type)
    return Claim(Key(PROVIDER, webhook_id), b"h" * 32, event_type, body, None, 60.0, 3600.0)
