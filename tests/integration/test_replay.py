"""Dead-letter replay (Receiver.replay): a failed, released or stale delivery runs again through
the claim and fence path, once; completed and live ones are refused. On both stores."""

from __future__ import annotations

import asyncio

import pytest

from receiver import Connection, Event, Provider, Receiver, ReplayRefused, State, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._verification.payload import parse
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    SECRET,
    Clock,
    body_of,
    effects,
    ledger_clock,
    signed,
)

LEASE = 60.0


def build(store: Store, clock: Clock) -> tuple[Receiver, list[str], set[str]]:
    """``order.created`` writes an effects row and fails while its id is in ``broken``;
    ``payment.created`` is external, without reconcile."""
    rx = Receiver(
        ledger_clock(store, clock), [Provider(PROVIDER, [SECRET], lease=LEASE)], clock=clock
    )
    runs: list[str] = []
    broken: set[str] = set()

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> dict[str, int]:
        runs.append(f"{event.id} {event.fence}")
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if event.id in broken:
            raise RuntimeError("downstream is down")
        return {"fence": event.fence}

    @rx.on("payment.created", effects="external")
    async def pay(event: Event, tx: Connection) -> dict[str, str]:
        runs.append(f"pay {event.id} {event.fence}")
        return {"paid": event.id}

    return rx, runs, broken


async def receipt(store: Store, webhook_id: str) -> ledger.Receipt:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    return found


async def dead_claim(store: Store, webhook_id: str, body: bytes, now: float) -> None:
    parsed = parse(body, None)
    claim = Claim(
        Key(PROVIDER, webhook_id), parsed.payload_hash, parsed.event_type, body, now, LEASE, 3600
    )
    async with store.acquire() as conn:
        claimed = await ledger.claim(conn, claim)
        assert isinstance(claimed, ledger.Claimed)
        assert claimed.fence == 1


async def test_a_released_delivery_runs_once_and_completes(store: Store) -> None:
    clock = Clock()
    rx, runs, broken = build(store, clock)
    body = body_of(order="o-1")
    async with rx:
        broken.add("msg_1")
        failed = await rx.deliver(PROVIDER, signed("msg_1", body, timestamp=clock.now), body)
        assert failed.status_code == 500
        assert (await receipt(store, "msg_1")).state == State.RELEASED
        broken.clear()  # downstream is back: the operator replays

        reply = await rx.replay(PROVIDER, "msg_1")
        assert reply.outcome.value == "executed"
        assert reply.fence == 2
        assert reply.response.body == b'{"fence":2}'
        done = await receipt(store, "msg_1")
        assert done.state == State.COMPLETED
        assert done.request_body is None  # dropped at completion, as always
        with pytest.raises(ReplayRefused, match=r"completed.*never run again"):
            await rx.replay(PROVIDER, "msg_1")
        # The sender's own retry now gets the replayed answer.
        again = await rx.deliver(PROVIDER, signed("msg_1", body, timestamp=clock.now), body)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.body == b'{"fence":2}'
        assert rx.metrics is not None
        assert (
            rx.metrics.registry.get_sample_value(
                "receiver_replays_total", {"provider": PROVIDER, "outcome": "executed"}
            )
            == 1
        )
    assert runs == ["msg_1 1", "msg_1 2"]
    assert await effects(store, "msg_1") == 1


async def test_a_failed_receipt_is_reopened_then_run(store: Store) -> None:
    """An interrupted external handler without reconcile was marked failed (needs review);
    after checking the outside system, the operator replays it: it runs, once."""
    clock = Clock()
    rx, runs, _ = build(store, clock)
    async with rx:
        await dead_claim(store, "msg_pay", body_of("payment.created"), clock.now)
        clock.advance(LEASE + 1)
        assert (await rx.sweep()).failed == 1
        assert (await receipt(store, "msg_pay")).state == State.FAILED
        assert runs == []
        reply = await rx.replay(PROVIDER, "msg_pay")
        assert reply.outcome.value == "executed"
        assert (await receipt(store, "msg_pay")).state == State.COMPLETED
    assert runs == ["pay msg_pay 3"]  # fence 2 was the sweeper's (marked failed)


async def test_a_stale_in_flight_delivery_is_replayed_a_live_one_refused(store: Store) -> None:
    clock = Clock()
    rx, runs, _ = build(store, clock)
    async with rx:
        await dead_claim(store, "msg_1", body_of(order="o-1"), clock.now)
        with pytest.raises(ReplayRefused, match=r"in flight.*holds its lease for 60 s"):
            await rx.replay(PROVIDER, "msg_1")
        clock.advance(LEASE)
        assert (await rx.replay(PROVIDER, "msg_1")).fence == 2
    assert runs == ["msg_1 2"]


async def test_unknown_receipts_and_providers_are_refused(store: Store) -> None:
    rx, runs, _ = build(store, Clock())
    async with rx:
        with pytest.raises(ReplayRefused, match="no receipt for acme/nope"):
            await rx.replay(PROVIDER, "nope")
        with pytest.raises(ReplayRefused, match="no provider named 'other'"):
            await rx.replay("other", "msg_1")
    assert runs == []


async def test_a_replay_racing_a_redelivery_runs_once(store: Store) -> None:
    clock = Clock()
    rx, runs, broken = build(store, clock)
    body = body_of(order="o-1")
    async with rx:
        broken.add("msg_1")
        await rx.deliver(PROVIDER, signed("msg_1", body, timestamp=clock.now), body)
        broken.clear()
        results = await asyncio.gather(
            rx.replay(PROVIDER, "msg_1"),
            rx.deliver(PROVIDER, signed("msg_1", body, timestamp=clock.now), body),
            return_exceptions=True,
        )
    assert runs.count("msg_1 2") == 1
    assert len(runs) == 2
    assert await effects(store, "msg_1") == 1
    refused = [r for r in results if isinstance(r, ReplayRefused)]
    assert len(refused) <= 1


async def test_a_stale_in_flight_external_delivery_is_reconciled_never_run_again(
    store: Store,
) -> None:
    """An external attempt whose process died (in flight, its lease run out) may have acted:
    an operator's replay reconciles it, or without reconcile() holds it for review; only the
    replay of the receipt a person has then looked at (failed) runs the handler."""
    clock = Clock()
    rx, runs, _ = build(store, clock)
    reconciled: list[str] = []

    async def refunded(event: Event) -> dict[str, str]:
        reconciled.append(f"{event.id} {event.fence}")
        return {"refunded": event.id}

    async def refund(event: Event, tx: Connection) -> None:
        runs.append(f"refund {event.id} {event.fence}")

    rx.add_handler("refund.created", refund, effects="external", reconcile=refunded)
    async with rx:
        await dead_claim(store, "msg_pay", body_of("payment.created"), clock.now)
        await dead_claim(store, "msg_refund", body_of("refund.created"), clock.now)
        clock.advance(LEASE + 1)
        held = await rx.replay(PROVIDER, "msg_pay")
        assert (held.outcome.value, held.fence) == ("needs_review", 2)
        assert (await receipt(store, "msg_pay")).state == State.FAILED
        done = await rx.replay(PROVIDER, "msg_refund")
        assert (done.outcome.value, done.response.body) == (
            "reconciled",
            b'{"refunded":"msg_refund"}',
        )
        assert (await receipt(store, "msg_refund")).state == State.COMPLETED
        assert runs == []
        assert reconciled == ["msg_refund 2"]
        # Looked at, the held one is replayed on purpose: now it runs, once.
        assert (await rx.replay(PROVIDER, "msg_pay")).outcome.value == "executed"
    assert runs == ["pay msg_pay 3"]
