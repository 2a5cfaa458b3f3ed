"""Handoff: an inline delivery still running when its sender's time is nearly spent is answered
202 (queued mode's answer) and finishes in the background, once, in its own transaction
(receiver/_webhooks/handoff.py). Real SQLite and PostgreSQL, over ASGI HTTP.

The provider's ``timeout`` is 1.5 s, so the budget is 1.0 s (less the 0.5 s margin); the slow
handler sleeps 3 s after its write.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson

from receiver import Connection, Event, PostgresStore, Provider, Receiver, Store
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, effects, signed

TIMEOUT = 1.5
SLOW = 3.0
QUEUED = {"status": "queued"}


def slow_receiver(store: Store, *, handoff: bool) -> tuple[Receiver, list[str]]:
    """A receiver whose handler writes one ``effects`` row, then sleeps ``SLOW`` seconds when
    the payload asks for it; ``calls`` lists every invocation."""
    rx = Receiver(
        store,
        [Provider(PROVIDER, [SECRET], timeout=TIMEOUT, handoff=handoff)],
        sweep_interval=None,
    )
    calls: list[str] = []

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def record(event: Event, tx: Connection) -> Any:
        calls.append(event.id)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        if event.payload["data"].get("slow"):
            await asyncio.sleep(SLOW)
        return {"done": event.id}

    return rx, calls


async def post(rx: Receiver, webhook_id: str, body: bytes) -> tuple[httpx.Response, float]:
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        began = time.perf_counter()
        answer = await client.post(f"/{PROVIDER}", content=body, headers=signed(webhook_id, body))
        return answer, time.perf_counter() - began


async def state(store: Store, webhook_id: str) -> str:
    async with store.acquire() as conn:
        return str(
            await conn.fetchval(
                "SELECT state FROM receiver_receipts WHERE webhook_id = $1", webhook_id
            )
        )


async def test_a_slow_delivery_is_answered_202_in_time_and_completes_once(store: Store) -> None:
    rx, calls = slow_receiver(store, handoff=True)
    body = body_of(slow=True)
    async with rx:
        answer, took = await post(rx, "msg_handoff_1", body)
        # Answered within the sender's limit, as queued mode answers; the handler still runs.
        assert answer.status_code == 202
        assert orjson.loads(answer.content) == QUEUED
        assert took < TIMEOUT
        assert calls == ["msg_handoff_1"]
        assert len(rx.handoffs.tasks) == 1
        # A redelivery meanwhile: the usual in-flight answer, nothing run.
        busy, _ = await post(rx, "msg_handoff_1", body)
        assert busy.status_code == 409
        assert calls == ["msg_handoff_1"]
        if isinstance(store, PostgresStore):  # SQLite's one writer: a read waits for the commit
            assert await state(store, "msg_handoff_1") == "in_flight"
            assert await effects(store, "msg_handoff_1") == 0
        # The delivery finishes in the background, in its own transaction.
        await asyncio.wait(set(rx.handoffs.tasks), timeout=SLOW + 10)
        assert not rx.handoffs.tasks
        assert await state(store, "msg_handoff_1") == "completed"
        assert await effects(store, "msg_handoff_1") == 1
        # After completion a redelivery replays the stored answer without running the handler:
        # the 202 the sender got, byte for byte, not the handler's answer it never saw.
        again, _ = await post(rx, "msg_handoff_1", body)
        assert (again.status_code, again.content) == (202, answer.content)
        assert again.headers["content-type"] == answer.headers["content-type"]
        assert again.headers["idempotent-replayed"] == "true"
        assert calls == ["msg_handoff_1"]
        assert rx.metrics is not None
        counted = rx.metrics.registry.get_sample_value(
            "receiver_deliveries_total",
            {"provider": PROVIDER, "outcome": "handed_off", "reason": ""},
        )
        assert counted == 1


async def test_closing_waits_for_a_handed_off_delivery(store: Store) -> None:
    rx, calls = slow_receiver(store, handoff=True)
    async with rx:
        answer, _ = await post(rx, "msg_handoff_2", body_of(slow=True))
        assert answer.status_code == 202
    # Closed after the handler finished and its transaction committed.
    assert calls == ["msg_handoff_2"]
    assert not rx.handoffs.tasks
    async with store.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM effects") == 1
    assert await state(store, "msg_handoff_2") == "completed"


async def test_without_handoff_the_answer_waits_for_the_handler(store: Store) -> None:
    rx, _ = slow_receiver(store, handoff=False)
    async with rx:
        answer, took = await post(rx, "msg_handoff_3", body_of(slow=True))
        assert answer.status_code == 200
        assert orjson.loads(answer.content) == {"done": "msg_handoff_3"}
        assert took >= SLOW
        assert not rx.handoffs.tasks
        assert await state(store, "msg_handoff_3") == "completed"


async def test_a_fast_delivery_gets_its_own_answer(store: Store) -> None:
    rx, calls = slow_receiver(store, handoff=True)
    async with rx:
        answer, took = await post(rx, "msg_handoff_4", body_of(slow=False))
        assert answer.status_code == 200
        assert orjson.loads(answer.content) == {"done": "msg_handoff_4"}
        assert took < TIMEOUT
        assert not rx.handoffs.tasks
        assert await state(store, "msg_handoff_4") == "completed"
        assert calls == ["msg_handoff_4"]
