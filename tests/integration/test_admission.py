"""Shed before claiming: past the bound on deliveries in progress, or past the sender's time
limit, a delivery is answered 503 with Retry-After at once and leaves no trace in the ledger,
so that the sender's retry runs it fresh (receiver/_webhooks/admission.py).

Real PostgreSQL: many concurrent deliveries released through one barrier against a bound of a
few, with the admitted ones held inside their handler.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest

from receiver import Connection, Event, PostgresStore, Provider, Receiver
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, effects, query, signed

BOUND = 4
COPIES = 24


class Calls(Counter[str]):
    """Handler calls by webhook-id; ``entered(n)`` waits until n more calls have begun."""

    def __init__(self) -> None:
        super().__init__()
        self.began: asyncio.Queue[str] = asyncio.Queue()
        self.order: list[str] = []  # every call, in the order they began

    async def entered(self, n: int) -> None:
        for _ in range(n):
            await asyncio.wait_for(self.began.get(), 10)


def held_receiver(
    store: PostgresStore, provider: dict[str, Any] | None = None, **options: Any
) -> tuple[Receiver, Calls, asyncio.Event]:
    """A receiver whose handler counts its call, then waits for the gate before it writes."""
    rx = Receiver(
        store, [Provider(PROVIDER, [SECRET], **(provider or {}))], sweep_interval=None, **options
    )
    calls = Calls()
    gate = asyncio.Event()

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def record(event: Event, tx: Connection) -> Any:
        calls[event.id] += 1
        calls.order.append(event.id)
        calls.began.put_nowait(event.id)
        await gate.wait()
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        return {"id": event.id}

    return rx, calls, gate


def delivery(n: int) -> tuple[str, dict[str, str], bytes]:
    webhook_id = f"msg_shed_{n:03d}"
    body = body_of(order=webhook_id)
    return webhook_id, signed(webhook_id, body), body


async def ledger_ids(pg_url: str) -> set[str]:
    rows = await query(pg_url, "SELECT webhook_id FROM receiver_receipts")
    return {r[0] for r in rows}


async def test_past_the_bound_a_delivery_is_shed_before_it_claims_anything(
    pg_store: PostgresStore, pg_url: str
) -> None:
    rx, calls, gate = held_receiver(
        pg_store, {"timeout": 2.0}, max_in_progress=BOUND, max_queue_wait=0.2
    )
    rx.admission.max_waiting = BOUND  # the line of deliveries waiting for a place
    deliveries = [delivery(n) for n in range(COPIES)]
    barrier = asyncio.Barrier(COPIES)

    async def one(headers: dict[str, str], body: bytes) -> Any:
        await barrier.wait()  # every delivery arrives together
        return await rx.deliver(PROVIDER, headers, body)

    async with rx:
        tasks = [asyncio.create_task(one(h, b)) for _, h, b in deliveries]
        # The admitted ones are held in their handler; the shed ones have their answer.
        await calls.entered(BOUND)
        # Past the bound, as many as the line holds wait for a place, the rest are answered at
        # once.
        await asyncio.sleep(0.5)
        assert sum(t.done() for t in tasks) == COPIES - 2 * BOUND
        # The waiting ones wait past max_queue_wait, while their sender's budget lasts (2 s,
        # less the answer's margin: 1.5 s); none gets a place while the admitted ones are held.
        await asyncio.sleep(0.5)
        assert sum(t.done() for t in tasks) == COPIES - 2 * BOUND
        await asyncio.sleep(0.8)
        shed = {i for i, t in enumerate(tasks) if t.done()}
        assert len(shed) == COPIES - BOUND
        assert len(calls) == BOUND
        for i in shed:
            answer = tasks[i].result()
            assert answer.status_code == 503
            assert int(answer.headers["retry-after"]) >= 1
            assert orjson.loads(answer.body)["error"] == "overloaded"
        # Nothing of a shed delivery is in the ledger; the admitted ones are claimed, in flight.
        shed_ids = {deliveries[i][0] for i in shed}
        admitted_ids = {deliveries[i][0] for i in range(COPIES)} - shed_ids
        assert await ledger_ids(pg_url) == admitted_ids
        assert set(calls) == admitted_ids
        assert rx.admission.shed_total["overloaded"] == COPIES - BOUND
        metric = rx.metrics.registry.get_sample_value(  # type: ignore[union-attr]
            "receiver_deliveries_total",
            {"provider": PROVIDER, "outcome": "shed", "reason": "overloaded"},
        )
        assert metric == COPIES - BOUND
        # This process's shed rate, on the console's overview.
        per_second, share = rx.admission.shed_rate()
        assert per_second == pytest.approx((COPIES - BOUND) / 60)
        assert share == pytest.approx((COPIES - BOUND) / COPIES)
        transport = httpx.ASGITransport(app=rx.console())
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            page = (await client.get("/")).text
        assert "Shed under load" in page
        assert f"{per_second:.1f}/s · {share:.0%}" in page

        gate.set()
        for i, t in enumerate(tasks):
            if i not in shed:
                assert (await t).status_code == 200
        # The senders' retries of the shed deliveries run fresh: executed once each. (Without
        # the bound: the held deliveries' latency, past the 2 s limit, would shed them too.)
        rx.admission.limit = 0
        for i in sorted(shed):
            _, headers, body = deliveries[i]
            answer = await rx.deliver(PROVIDER, headers, body)
            assert answer.status_code == 200
            assert "idempotent-replayed" not in answer.headers
    assert calls == Counter({webhook_id: 1 for webhook_id, _, _ in deliveries})
    assert await effects(pg_store) == COPIES
    assert rx.admission.in_progress == 0


async def test_a_delivery_past_its_senders_time_limit_is_not_started(
    pg_store: PostgresStore, pg_url: str
) -> None:
    rx, calls, gate = held_receiver(pg_store)
    gate.set()
    webhook_id, headers, body = delivery(1)
    async with rx:
        # The preset's limit (Svix: 15 s) is gone: the sender has hung up.
        answer = await rx.deliver(PROVIDER, headers, body, waited=16.0)
        assert answer.status_code == 503
        assert orjson.loads(answer.body)["error"] == "past_budget"
        assert await ledger_ids(pg_url) == set()
        assert not calls
        # Its retry, in time, runs it.
        answer = await rx.deliver(PROVIDER, headers, body, waited=0.5)
        assert answer.status_code == 200
    assert calls == Counter({webhook_id: 1})
    assert rx.admission.shed_total == {"overloaded": 0, "past_budget": 1}


async def test_a_provider_may_ask_for_429_and_a_bound_of_0_admits_everything(
    pg_store: PostgresStore, pg_url: str
) -> None:
    rx, calls, gate = held_receiver(
        pg_store, {"shed_status": 429, "timeout": None}, max_in_progress=1
    )
    (_, h1, b1), (id2, h2, b2) = delivery(1), delivery(2)
    async with rx:
        first = asyncio.create_task(rx.deliver(PROVIDER, h1, b1))
        await calls.entered(1)
        answer = await asyncio.wait_for(rx.deliver(PROVIDER, h2, b2), 10)
        assert answer.status_code == 429
        assert int(answer.headers["retry-after"]) >= 1
        assert id2 not in await ledger_ids(pg_url)
        # No bound: both run side by side; no sender limit: however long it waited.
        rx.admission.limit = 0
        second = asyncio.create_task(rx.deliver(PROVIDER, h2, b2, waited=3600.0))
        await calls.entered(1)
        gate.set()
        assert (await first).status_code == (await second).status_code == 200


async def test_past_the_bound_a_delivery_waits_briefly_for_a_place(
    pg_store: PostgresStore, pg_url: str
) -> None:
    rx, calls, gate = held_receiver(pg_store, max_in_progress=1, max_queue_wait=5.0)
    rx.admission.max_waiting = 1
    (id1, h1, b1), (id2, h2, b2), (_, h3, b3) = delivery(1), delivery(2), delivery(3)
    async with rx:
        first = asyncio.create_task(rx.deliver(PROVIDER, h1, b1))
        await calls.entered(1)
        second = asyncio.create_task(rx.deliver(PROVIDER, h2, b2))  # waits for the place
        await asyncio.sleep(0.1)
        # One waits (as many as the line holds): the next is answered at once, nothing claimed.
        third = await asyncio.wait_for(rx.deliver(PROVIDER, h3, b3), 1)
        assert third.status_code == 503
        assert not second.done()
        assert await ledger_ids(pg_url) == {id1}
        gate.set()  # the first finishes and hands its place to the second
        assert (await first).status_code == (await second).status_code == 200
    assert calls == Counter({id1: 1, id2: 1})
    assert rx.admission.in_progress == 0


async def test_the_wait_for_a_place_counts_in_the_reported_duration(
    pg_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    # An operator watching the delivery latency under a flood must see what the senders see:
    # the time from arrival to answer, the wait for a place included.
    rx, calls, gate = held_receiver(pg_store, max_in_progress=1, max_queue_wait=5.0)
    (_, h1, b1), (id2, h2, b2) = delivery(1), delivery(2)
    caplog.set_level(logging.INFO, logger="receiver")
    async with rx:
        first = asyncio.create_task(rx.deliver(PROVIDER, h1, b1))
        await calls.entered(1)
        second = asyncio.create_task(rx.deliver(PROVIDER, h2, b2))  # waits for the place
        await asyncio.sleep(0.4)
        gate.set()
        assert (await first).status_code == (await second).status_code == 200
    registry = rx.metrics.registry
    labels = {"provider": PROVIDER, "outcome": "executed"}
    count = registry.get_sample_value("receiver_delivery_duration_seconds_count", labels)
    quick = registry.get_sample_value(
        "receiver_delivery_duration_seconds_bucket", {**labels, "le": "0.25"}
    )
    assert (count, quick) == (2, 0)  # the second waited 0.4 s, then ran at once
    logged = {
        r.webhook_id: r.duration_ms  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "outcome", None) == "executed"
    }
    assert logged[id2] >= 400


async def test_after_a_slow_spell_each_provider_is_admitted_again_by_itself(
    pg_store: PostgresStore, pg_url: str
) -> None:
    # Real short limits (1 s; the answer's margin is 0.5 s): one delivery of "chat" slower than
    # its sender's limit, then normal traffic. No restart: "chat" is admitted again at once
    # (a delivery that has not waited is always started) and, as its deliveries are fast
    # again, even after a wait; "hub" is judged on its own deliveries throughout.
    rx = Receiver(
        pg_store,
        [Provider("chat", [SECRET], timeout=1.0), Provider("hub", [SECRET], timeout=1.0)],
        sweep_interval=None,
    )
    slow = {"msg_spell_000"}
    ran: Counter[str] = Counter()

    @rx.on("order.created")
    async def record(event: Event, tx: Connection) -> Any:
        ran[event.id] += 1
        if event.id in slow:
            await asyncio.sleep(1.3)
        return {"id": event.id}

    async def send(provider: str, n: int, waited: float = 0.0) -> int:
        webhook_id = f"msg_spell_{n:03d}"
        body = body_of(order=webhook_id)
        answer = await rx.deliver(provider, signed(webhook_id, body), body, waited=waited)
        return answer.status_code

    async with rx:
        assert await send("chat", 0) == 200  # 1.3 s: past its sender's 1 s
        assert await send("chat", 1) == 200  # not waited: started, however slow the last
        assert await send("hub", 2, waited=0.3) == 200  # another provider: its own budget
        assert await send("chat", 3, waited=0.6) == 503  # slow and waited: not in time
        for n in range(4, 40):  # normal traffic
            assert await send("chat", n) == 200
        assert await send("chat", 40, waited=0.6) == 200  # fast again: in time after a wait
    assert rx.admission.shed_total == {"overloaded": 0, "past_budget": 1}
    assert "msg_spell_003" not in await ledger_ids(pg_url)
    assert ran == Counter({f"msg_spell_{n:03d}": 1 for n in range(41) if n != 3})
