"""The recovery of a stale receipt, step by step (receiver/_webhooks/recovery.py): what
reconcile() is handed and what its answer becomes, what a failed reconcile() leaves in the
ledger and the log, the answer when another attempt took the receipt first, an attempt this
process still runs, a type that came from a header, and a worker's recovery of a queued
receipt. On every store layout."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import orjson
import pytest

from receiver import Connection, Event, Provider, Receiver, State, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._verification.payload import parse
from tests.integration.test_queued import QUEUED_BODY, deliver, drain, queued_receiver
from tests.integration.test_queued import receipt as queued_receipt
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, Clock, body_of, effects, signed

LEASE = 60.0


class Money:
    """A value only the receiver's ``encoder`` can store."""

    def __init__(self, amount: str) -> None:
        self.amount = amount


def encoder(value: Any) -> Any:
    if isinstance(value, Money):
        return {"money": value.amount}
    raise TypeError(type(value).__name__)


def build(store: Store, clock: Clock, reconcile: Any) -> tuple[Receiver, list[str]]:
    """``payment.created``: an external handler with ``reconcile`` and a transactional one
    that writes an effects row; ``push`` (a type no body carries): a transactional one."""
    store.clock = clock
    rx = Receiver(
        store,
        [Provider(PROVIDER, [SECRET], lease=LEASE)],
        clock=clock,
        encoder=encoder,
    )
    runs: list[str] = []

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    async def reconciler(event: Event) -> Any:
        runs.append(f"reconcile {event.id} {event.fence}")
        return await reconcile(event)

    @rx.on("payment.created", effects="external", reconcile=reconciler)
    async def pay(event: Event, tx: Connection) -> dict[str, str]:
        runs.append(f"pay {event.id} {event.fence}")
        return {"paid": event.id}

    async def book(event: Event, tx: Connection) -> None:
        runs.append(f"book {event.type} {event.fence}")
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )

    rx.on("payment.created")(book)
    rx.on("push")(book)
    return rx, runs


async def dead_claim(
    store: Store, webhook_id: str, body: bytes, now: float, event_type: str | None = None
) -> None:
    """A worker claimed the key (fence 1) and died."""
    parsed = parse(body, event_type)
    claim = Claim(
        Key(PROVIDER, webhook_id), parsed.payload_hash, parsed.event_type, body, now, LEASE, 3600
    )
    async with store.acquire() as conn:
        assert isinstance(await ledger.claim(conn, claim), ledger.Claimed)


async def receipt(store: Store, webhook_id: str) -> ledger.Receipt:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    return found


async def stale(store: Store, clock: Clock, reconcile: Any) -> tuple[Receiver, list[str]]:
    rx, runs = build(store, clock, reconcile)
    await rx.open()
    await dead_claim(store, "pay_1", body_of("payment.created", amount="12.50"), clock.now)
    clock.advance(LEASE + 1)
    return rx, runs


async def test_reconcile_extends_its_lease_and_its_answer_goes_through_the_encoder(
    store: Store,
) -> None:
    clock = Clock()
    leases: list[float] = []

    async def reconcile(event: Event) -> Money:
        await event.extend_lease(300)  # the outside system is slow to answer
        leases.append((await receipt(store, event.id)).lease_until)
        return Money("12.50")

    rx, runs = await stale(store, clock, reconcile)
    try:
        assert (await rx.sweep()).recovered == 1
        assert leases == [clock.now + 300]  # this attempt's own lease, under its fence
        # The external effect is not run again; the transactional one is (its write died with
        # the interrupted transaction), under the new fence.
        assert runs == ["reconcile pay_1 2", "book payment.created 2"]
        assert await effects(store, "pay_1") == 1
        found = await receipt(store, "pay_1")
        assert (found.state, found.fence) == ("completed", 2)
        assert found.response is not None
        assert found.response.body == b'{"money":"12.50"}'
    finally:
        await rx.close()


async def test_reconcile_answering_nothing_stores_an_empty_success(store: Store) -> None:
    clock = Clock()

    async def reconcile(event: Event) -> None:
        return None

    rx, runs = await stale(store, clock, reconcile)
    try:
        assert (await rx.sweep()).recovered == 1
        found = await receipt(store, "pay_1")
        assert found.state == "completed"
        assert found.response is not None
        assert found.response.status == 200
        assert runs == ["reconcile pay_1 2", "book payment.created 2"]
    finally:
        await rx.close()


async def test_an_unstorable_reconcile_answer_needs_review(store: Store) -> None:
    clock = Clock()

    async def reconcile(event: Event) -> object:
        return object()

    rx, runs = await stale(store, clock, reconcile)
    try:
        assert (await rx.sweep()).failed == 1
        assert runs == ["reconcile pay_1 2"]  # nothing runs: a person decides
        found = await receipt(store, "pay_1")
        assert (found.state, found.fence) == ("failed", 2)
        assert found.response is not None
        assert found.response.status == 202
        assert found.last_error == (
            "reconcile() returned a object, which cannot be stored; check the outside system, "
            "then `receiver replay`"
        )
    finally:
        await rx.close()


async def test_a_failed_reconcile_keeps_the_claim_with_its_lease_ended(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()

    async def reconcile(event: Event) -> None:
        raise ValueError("card 4242 4242 4242 4242 declined")

    rx, runs = await stale(store, clock, reconcile)
    try:
        provider = rx.providers[PROVIDER]
        with caplog.at_level(logging.ERROR, logger="receiver"):
            reply = await rx.pipeline.recover(provider, await receipt(store, "pay_1"))
        assert reply is not None
        assert (reply.outcome.value, reply.fence) == ("handler_failed", 2)
        assert reply.response.status_code == 500
        assert orjson.loads(bytes(reply.response.body)) == {
            "error": "handler_failed",
            "detail": "reconciling the delivery failed; retry later",
        }
        assert runs == ["reconcile pay_1 2"]
        found = await receipt(store, "pay_1")
        # Never released (a retry would run the external handler again): in flight under the
        # new fence, its lease ended now, so the next attempt or sweep reconciles again.
        assert (found.state, found.fence) == ("in_flight", 2)
        assert found.lease_until == clock.now
        assert found.last_error == "reconcile: ValueError: card \u2022\u2022\u2022 declined"
        [record] = [r for r in caplog.records if r.name == "receiver"]
        # The line docs/reference/metrics.md lists, with the receipt's key and fence; never
        # the exception's text (it can carry payload values).
        assert record.getMessage() == (
            "reconcile failed; the delivery stays unresolved until it is reconciled "
            f"(ValueError) provider={PROVIDER} webhook_id=pay_1 fence=2"
        )
    finally:
        await rx.close()


async def test_a_recovery_that_another_attempt_took_over_answers_in_flight(
    store: Store,
) -> None:
    clock = Clock()

    async def reconcile(event: Event) -> None:
        raise AssertionError("the other attempt reconciles, not this one")

    rx, runs = await stale(store, clock, reconcile)
    try:
        seen = await receipt(store, "pay_1")
        body = body_of("payment.created", amount="12.50")
        parsed = parse(body, None)
        claim = Claim(
            seen.key, parsed.payload_hash, parsed.event_type, body, clock.now, LEASE, 3600
        )
        async with store.acquire() as conn:  # a redelivery took it over first
            assert await ledger.reclaim(conn, claim, seen.fence) == 2
        reply = await rx.pipeline.recover(rx.providers[PROVIDER], seen)
        assert reply is not None
        assert reply.outcome.value == "in_flight_conflict"
        assert (reply.fence, reply.response.status_code) == (1, 409)  # the fence it had seen
        assert int(reply.response.headers["retry-after"]) >= 1
        assert runs == []
        found = await receipt(store, "pay_1")
        assert (found.state, found.fence) == ("in_flight", 2)
    finally:
        await rx.close()


async def test_a_type_taken_from_a_header_is_kept_by_the_recovery(store: Store) -> None:
    clock = Clock()

    async def reconcile(event: Event) -> None:
        return None

    rx, runs = build(store, clock, reconcile)
    await rx.open()
    try:
        # GitHub-like: the type came from a header, the body has none.
        await dead_claim(store, "push_1", b'{"ref":"main"}', clock.now, event_type="push")
        clock.advance(LEASE + 1)
        assert (await rx.sweep()).recovered == 1
        assert runs == ["book push 2"]
        assert (await receipt(store, "push_1")).state == "completed"
    finally:
        await rx.close()


@pytest.mark.parametrize(("ahead", "taken_over"), [(LEASE - 1, False), (LEASE, True)])
async def test_an_attempt_this_process_runs_is_not_taken_over_while_its_lease_lasts(
    store: Store, ahead: float, taken_over: bool
) -> None:
    """The ledger's clock (the database's) ran past the lease, this process's has not: the
    attempt is alive, so recovering it would run it twice. At its lease's end it is not."""
    process, database = Clock(), Clock()
    rx, runs = build(store, database, None)
    rx.pipeline.clock = process
    started, go = asyncio.Event(), asyncio.Event()

    @rx.on("order.created")
    async def slow(event: Event, tx: Connection) -> dict[str, int]:
        runs.append(f"order {event.fence}")
        if event.fence == 1:
            started.set()
            await go.wait()
        return {"fence": event.fence}

    await rx.open()
    try:
        body = body_of("order.created")
        transport = httpx.ASGITransport(app=rx)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            headers = signed("o_1", body, timestamp=database.now)
            first = asyncio.create_task(client.post(f"/{PROVIDER}", content=body, headers=headers))
            await started.wait()
            database.advance(LEASE + 1)
            process.advance(ahead)
            reply = await rx.pipeline.recover(rx.providers[PROVIDER], await receipt(store, "o_1"))
            assert (reply is not None) is taken_over
            assert runs == (["order 1", "order 2"] if taken_over else ["order 1"])
            go.set()
            await first
    finally:
        await rx.close()


async def test_a_workers_recovery_of_a_queued_receipt_stays_on_the_queue(store: Store) -> None:
    """A worker died mid-attempt and the next attempt fails too: the queued receipt is
    scheduled for the workers' next attempt (its sender was answered 202 long ago), not
    released for a sender's retry that will never come."""
    clock = Clock()
    rx, state = queued_receiver(store, clock, lease=30.0)
    state["crash"].add("q1")
    async with rx:
        await deliver(rx, "q1", body_of(order=1), clock)
        assert await drain(rx) == {}  # the crash escapes the worker, like a kill
        rx.pipeline._running.clear()  # a new process: it does not know the dead attempt
        state["fail"] = True
        clock.advance(31.0)
        await drain(rx)
        found = await queued_receipt(store, "q1")
        assert (found.state, found.fence, found.attempts) == (State.QUEUED, 2, 1)
        assert found.response is not None
        assert found.response.body == QUEUED_BODY


async def test_an_empty_body_is_recovered_as_it_came(store: Store) -> None:
    """A delivery whose body is empty was claimed (its 400 is stored, so that redeliveries
    replay it) and the process died first: the recovery keeps that body and its hash."""
    clock = Clock()

    async def reconcile(event: Event) -> None:
        return None

    rx, runs = build(store, clock, reconcile)
    await rx.open()
    try:
        await dead_claim(store, "empty_1", b"", clock.now, event_type="push")
        before = await receipt(store, "empty_1")
        clock.advance(LEASE + 1)
        await rx.sweep()
        found = await receipt(store, "empty_1")
        assert found.fence == 2
        assert (found.request_body, found.payload_hash) == (b"", before.payload_hash)
        assert runs == []  # nothing can run on it
    finally:
        await rx.close()
