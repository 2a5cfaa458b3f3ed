"""On PostgreSQL, inline deliveries whose handlers are all transactional share group
transactions while other deliveries are running (Groups.run_inline): one BEGIN, the handlers of
each member in turn, one pipelined completion statement and one COMMIT. What must hold: each
delivery's writes commit exactly once with its completion and its sender gets its own answer;
a member that fails gets its own 500 and costs the others nothing but a second run of their
rolled-back handlers; a slow handler never holds back the deliveries behind it; a delivery
alone runs as alone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from receiver import Event, PostgresStore, Provider, Receiver, State
from receiver._store.base import Connection
from tests.integration.test_queued import receipt
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, Clock, signed

pytestmark = pytest.mark.asyncio


def _receiver(store: PostgresStore, clock: Clock, state: dict[str, Any]) -> Receiver:
    store.clock = clock
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], lease=30.0)], clock=clock)

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> dict[str, str]:
        state["calls"][event.id] = state["calls"].get(event.id, 0) + 1
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        try:
            await asyncio.sleep(state["slow"].get(event.id, 0.0))
            # The transaction this delivery's writes commit in.
            xid = await tx.fetchval("SELECT txid_current()::text")
            state["xids"][event.id] = xid
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
                event.provider,
                event.id,
                event.fence,
                xid,
            )
            if event.id in state["fail"]:
                raise RuntimeError("downstream refused")
            return {"id": event.id}
        finally:
            state["now"] -= 1

    return rx


def _state() -> dict[str, Any]:
    return {"calls": {}, "xids": {}, "fail": set(), "slow": {}, "now": 0, "most": 0}


async def _deliver(rx: Receiver, clock: Clock, webhook_id: str) -> tuple[int, bytes]:
    body = orjson.dumps({"type": "order.created", "data": {"id": webhook_id}})
    response = await rx.deliver(PROVIDER, signed(webhook_id, body, timestamp=clock()), body)
    return response.status_code, bytes(response.body)


async def _effects(store: PostgresStore) -> dict[str, list[str]]:
    async with store.acquire() as conn:
        rows = await conn.fetch("SELECT webhook_id, note FROM effects ORDER BY webhook_id")
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["webhook_id"], []).append(row["note"])
    return found


async def test_concurrent_deliveries_share_transactions_and_each_commits_once(
    pg_store: PostgresStore,
) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(32)]
        answers = await asyncio.gather(*(_deliver(rx, clock, i) for i in ids))
        # Each sender got its own handler's answer.
        assert [status for status, _ in answers] == [200] * len(ids)
        assert [orjson.loads(body)["id"] for _, body in answers] == ids
        effects = await _effects(pg_store)
        assert sorted(effects) == ids
        assert all(len(rows) == 1 for rows in effects.values())
        # Fewer transactions than deliveries; each row committed in the transaction its
        # handler saw, with its completion.
        xids = [rows[0] for rows in effects.values()]
        assert len(set(xids)) < len(ids)
        assert all(effects[i] == [state["xids"][i]] for i in ids)
        assert set(state["calls"].values()) == {1}
        for webhook_id in ids:
            assert (await receipt(pg_store, webhook_id)).state is State.COMPLETED
        # Redeliveries replay the stored answers.
        again = await asyncio.gather(*(_deliver(rx, clock, i) for i in ids[:4]))
        assert again == answers[:4]
        assert set(state["calls"].values()) == {1}


async def test_a_failing_member_fails_alone_and_the_rest_commit_once(
    pg_store: PostgresStore,
) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        ids = [f"msg_{i:02}" for i in range(24)]
        state["fail"].update({"msg_05", "msg_17"})
        replies = await asyncio.gather(*(_deliver(rx, clock, i) for i in ids))
        answers = dict(zip(ids, replies, strict=True))
        assert {i for i, (status, _) in answers.items() if status == 500} == state["fail"]
        assert all(status == 200 for i, (status, _) in answers.items() if i not in state["fail"])
        effects = await _effects(pg_store)
        # The failing members' writes rolled back; every other member committed once.
        assert sorted(effects) == sorted(set(ids) - state["fail"])
        assert all(len(rows) == 1 for rows in effects.values()), effects
        for webhook_id in state["fail"]:
            failed = await receipt(pg_store, webhook_id)
            assert failed.state is State.RELEASED
            assert failed.attempts == 1
        # The sender's retry runs the failed one again, and it commits once.
        state["fail"].discard("msg_05")
        assert (await _deliver(rx, clock, "msg_05"))[0] == 200
        assert len((await _effects(pg_store))["msg_05"]) == 1


async def test_a_slow_handler_does_not_hold_back_the_deliveries_behind_it(
    pg_store: PostgresStore,
) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        slow = [f"slow_{i}" for i in range(8)]
        for webhook_id in slow:
            state["slow"][webhook_id] = 1.0
        first = [asyncio.ensure_future(_deliver(rx, clock, i)) for i in slow]
        await asyncio.sleep(0.3)  # every group slot is taken by a slow handler
        began = time.monotonic()
        quick = await asyncio.gather(*(_deliver(rx, clock, f"msg_{i}") for i in range(6)))
        took = time.monotonic() - began
        assert [status for status, _ in quick] == [200] * 6
        # They waited a group's budget at most, never for the slow handlers to end.
        assert took < 0.6, took
        assert not any(f.done() for f in first)
        assert [status for status, _ in await asyncio.gather(*first)] == [200] * 8
        effects = await _effects(pg_store)
        assert all(len(rows) == 1 for rows in effects.values())
        assert len(effects) == 14


async def test_a_delivery_alone_has_its_own_transaction(pg_store: PostgresStore) -> None:
    clock, state = Clock(), _state()
    rx = _receiver(pg_store, clock, state)
    async with rx:
        for i in range(3):
            assert (await _deliver(rx, clock, f"msg_{i}"))[0] == 200
        effects = await _effects(pg_store)
        assert len({rows[0] for rows in effects.values()}) == 3
