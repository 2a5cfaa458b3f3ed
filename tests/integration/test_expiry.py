"""What expiry means for each state (docs/explanation/ledger.md, "Expiry, by state"), on both
stores: a completed receipt is deleted when its window ends; a dead letter (failed, or released
after a failed attempt) is kept for the retention after its window; an in-flight receipt is
never deleted unrun."""

from __future__ import annotations

import time

import httpx
import pytest

from receiver import Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._ops.sweeper import DEAD_LETTER_RETENTION
from receiver._verification.payload import parse
from receiver._webhooks.sweeper import sweep
from tests.integration.test_sweeper import LEASE, build, dead_claim
from tests.support import PROVIDER, ROW_EXPIRY, Clock, body_of, effects, signed


async def states(store: Store) -> dict[str, str]:
    async with store.acquire() as conn:
        rows = await conn.fetch("SELECT webhook_id, state FROM receiver_receipts")
    return {r["webhook_id"]: r["state"] for r in rows}


async def attempts(store: Store) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM receiver_attempts"))


async def test_crashed_deliveries_are_all_run_before_anything_expires(store: Store) -> None:
    """150 deliveries whose worker died, swept only after their window: every one runs (once),
    none is deleted unrun, although one stale batch holds 100."""
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    for i in range(150):
        await dead_claim(store, f"msg_{i}", body_of("order.created", i=i), clock.now)
    clock.advance(3600 + 1)  # dead_claim's window
    report = await rx.sweep()
    assert report.recovered == 150
    assert len(runs) == 150
    assert await effects(store) == 150
    assert set((await states(store)).values()) == {"completed"}


async def test_an_in_flight_receipt_past_its_window_is_kept_while_its_lease_lives(
    store: Store,
) -> None:
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    body = body_of("order.created")
    parsed = parse(body, None)
    # A long handler extended its lease past the window: its work is unfinished.
    claim = Claim(Key(PROVIDER, "msg_long"), parsed.payload_hash, "order.created", body,
                  clock.now, 7200, 3600)  # fmt: skip
    async with store.acquire() as conn:
        assert isinstance(await ledger.claim(conn, claim), ledger.Claimed)
    clock.advance(3601)
    report = await rx.sweep()
    assert (report.deleted, report.recovered) == (0, 0)
    assert await states(store) == {"msg_long": "in_flight"}
    clock.advance(3600)  # the lease ran out: recovered, not deleted
    assert (await rx.sweep()).recovered == 1
    assert runs == ["order msg_long 2"]


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_dead_letters_outlive_their_window_by_the_retention(store: Store) -> None:
    clock = Clock()
    rx, _ = build(store, clock)
    rx.on("order.failing")(_failing)
    await rx.open()
    window = rx.providers[PROVIDER].window.window
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for webhook_id, body, status in [
            ("msg_done", body_of("order.created"), 200),
            ("msg_invalid", b'{"no type": true}', 400),
            ("msg_released", body_of("order.failing"), 500),
        ]:
            answer = await client.post(
                f"/{PROVIDER}", content=body, headers=signed(webhook_id, body, timestamp=clock.now)
            )
            assert answer.status_code == status, answer.text
    assert await states(store) == {
        "msg_done": "completed",
        "msg_invalid": "failed",
        "msg_released": "released",
    }
    assert await attempts(store) == 1

    clock.advance(window + 1)
    assert (await rx.sweep()).deleted == 1
    assert await states(store) == {"msg_invalid": "failed", "msg_released": "released"}

    clock.advance(DEAD_LETTER_RETENTION - 60)
    assert (await rx.sweep()).deleted == 0

    clock.advance(61)
    assert (await rx.sweep()).deleted == 2
    assert await states(store) == {}
    assert await attempts(store) == 0  # the dead letters' attempts go with them


async def _failing(event: object) -> None:
    raise RuntimeError("downstream refused")


async def test_a_pass_that_recovers_a_few_deletes_none_of_the_rest(store: Store) -> None:
    """However few stale receipts one pass recovers, the rest wait for the next pass."""
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    for i in range(30):
        await dead_claim(store, f"msg_{i}", body_of("order.created", i=i), clock.now)
    clock.advance(3600 + LEASE)
    first = await sweep(store, rx.pipeline, rx.providers, now=clock.now, batch=10, max_batches=1)
    assert (first.recovered, first.deleted) == (10, 0)
    while (await sweep(store, rx.pipeline, rx.providers, now=clock.now, batch=10)).recovered:
        pass
    assert len(runs) == 30
    assert await effects(store) == 30


async def test_without_a_time_the_statements_use_the_databases_clock(store: Store) -> None:
    """``now`` NULL: expiry and leases judged by the database's clock (DESIGN.md: never by each
    replica's own), as the ledger's other statements do."""
    real = time.time()
    done = ledger.StoredResponse(200, "application/json", b"{}")
    for webhook_id, claimed in (("msg_old", real - 7200), ("msg_new", real)):
        body = body_of("order.created", id=webhook_id)
        await dead_claim(store, webhook_id, body, claimed)  # window 3600 s, lease 60 s
    async with store.acquire() as conn:
        stale = await conn.run_all("stale", None, 10)
        assert [r["webhook_id"] for r in stale] == ["msg_old"]
        await ledger.complete(conn, Key(PROVIDER, "msg_old"), 1, done, real)
        await ledger.complete(conn, Key(PROVIDER, "msg_new"), 1, done, real)
        rows = await conn.run_all("delete_expired", None, DEAD_LETTER_RETENTION, 10)
    assert sum(r["n"] for r in rows) == 1
    assert await states(store) == {"msg_new": "completed"}
