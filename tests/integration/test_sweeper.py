"""The sweeper: stale in-flight receipts end in the right state, expired receipts go, and two
sweepers at once do each receipt once. On both stores."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receiver import (
    RUN_AGAIN,
    ConfigurationError,
    Connection,
    Event,
    PostgresStore,
    Provider,
    Receiver,
    Store,
)
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._ops.sweeper import SweepReport, _recover_keyed
from receiver._ops.sweeper import sweep as shared_sweep
from receiver._verification.payload import parse
from receiver._webhooks.sweeper import sweep as webhook_sweep
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    ROW_EXPIRY,
    SECRET,
    Clock,
    body_of,
    effects,
    ledger_clock,
)

LEASE = 60.0


def build(store: Store, clock: Clock, reconcile: str | None = None) -> tuple[Receiver, list[str]]:
    rx = Receiver(
        ledger_clock(store, clock), [Provider(PROVIDER, [SECRET], lease=LEASE)], clock=clock
    )
    runs: list[str] = []

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> dict[str, int]:
        runs.append(f"order {event.id} {event.fence}")
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        return {"fence": event.fence}

    async def reconciler(event: Event) -> Any:
        runs.append(f"reconcile {event.id}")
        return RUN_AGAIN if reconcile == "again" else {"reconciled": event.id}

    @rx.on(
        "payment.created",
        effects="external",
        reconcile=reconciler if reconcile is not None else None,
    )
    async def pay(event: Event, tx: Connection) -> dict[str, str]:
        runs.append(f"pay {event.id} {event.fence}")
        return {"paid": event.id}

    return rx, runs


async def dead_claim(store: Store, webhook_id: str, body: bytes, now: float) -> None:
    """A worker claimed the key and died."""
    parsed = parse(body, None)
    claim = Claim(
        Key(PROVIDER, webhook_id), parsed.payload_hash, parsed.event_type, body, now, LEASE, 3600
    )
    async with store.acquire() as conn:
        claimed = await ledger.claim(conn, claim)
        assert isinstance(claimed, ledger.Claimed)
        assert claimed.fence == 1


async def receipt(store: Store, webhook_id: str) -> ledger.Receipt:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    return found


async def test_stale_transactional_receipt_is_run_again(store: Store) -> None:
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    await dead_claim(store, "msg_1", body_of("order.created"), clock.now)
    assert (await rx.sweep()).recovered == 0  # the lease is still live
    clock.advance(LEASE + 1)
    report = await rx.sweep()
    assert report.recovered == 1
    assert runs == ["order msg_1 2"]
    found = await receipt(store, "msg_1")
    assert (found.state, found.fence) == ("completed", 2)
    assert found.response is not None
    assert found.response.body == b'{"fence":2}'
    assert await effects(store, "msg_1") == 1
    assert (await rx.sweep()).recovered == 0  # done once


async def test_stale_external_receipt_without_reconcile_fails(store: Store) -> None:
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    await dead_claim(store, "msg_1", body_of("payment.created"), clock.now)
    clock.advance(LEASE + 1)
    report = await rx.sweep()
    assert report.failed == 1
    assert runs == []  # never re-run blindly
    found = await receipt(store, "msg_1")
    assert found.state == "failed"
    assert found.response is not None
    assert found.response.status == 202
    # What the operator reads in the console and the CLI: what to do about it.
    assert found.last_error == (
        "an attempt of an external handler without reconcile() was interrupted: it may or may "
        "not have acted; check the outside system, then `receiver replay`"
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("done", ["reconcile msg_1"]), ("again", ["reconcile msg_1", "pay msg_1 2"])],
)
async def test_stale_external_receipt_is_reconciled(
    store: Store, mode: str, expected: list[str]
) -> None:
    clock = Clock()
    rx, runs = build(store, clock, reconcile=mode)
    await rx.open()
    await dead_claim(store, "msg_1", body_of("payment.created"), clock.now)
    clock.advance(LEASE + 1)
    assert (await rx.sweep()).recovered == 1
    assert runs == expected
    found = await receipt(store, "msg_1")
    assert found.state == "completed"
    answer = b'{"reconciled":"msg_1"}' if mode == "done" else b'{"paid":"msg_1"}'
    assert found.response is not None
    assert found.response.body == answer


async def test_a_stale_idempotency_key_is_given_back_by_the_receivers_sweep(store: Store) -> None:
    """An Idempotency-Key request whose process died before its answer was stored: the sweep
    releases its key, so that the client's retry runs the endpoint again."""
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    keys = [Key("idem:tenant-1", f"POST /orders k-{n}") for n in (1, 2)]
    async with store.acquire() as conn:
        for key in keys:
            claim = Claim(key, b"h" * 32, None, b"{}", clock.now, LEASE, 3600)
            assert isinstance(await ledger.claim(conn, claim), ledger.Claimed)
    clock.advance(LEASE + 1)
    assert await rx.sweep() == SweepReport(released=2)
    for key in keys:
        async with store.acquire() as conn:
            found = await ledger.lookup(conn, key)
        assert found is not None
        assert (found.state, found.last_error) == ("released", "lease expired")
    assert runs == []


async def test_a_sweep_batch_out_of_range_is_refused_by_name(store: Store) -> None:
    rx, _ = build(store, Clock())
    await rx.open()
    with pytest.raises(ConfigurationError, match=r"^batch must be a whole number from 1 to"):
        await rx.sweep(batch=0)


async def test_unknown_provider_receipt_is_failed(store: Store) -> None:
    clock = Clock()
    rx, _ = build(store, clock)
    await rx.open()
    body = body_of("order.created")
    parsed = parse(body, None)
    async with store.acquire() as conn:
        await ledger.claim(
            conn,
            Claim(
                Key("gone", "msg_1"), parsed.payload_hash, "order.created", body, clock.now, 1, 3600
            ),
        )
    clock.advance(2)
    assert (await rx.sweep()).failed == 1
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key("gone", "msg_1"))
    assert found is not None
    assert found.state == "failed"


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_expired_receipts_are_deleted_in_batches(store: Store) -> None:
    clock = Clock()
    rx, _ = build(store, clock)
    await rx.open()
    done = ledger.StoredResponse(200, "application/json", b"{}")
    for i in range(25):
        await dead_claim(store, f"msg_{i}", body_of("order.created", i=i), clock.now)
        async with store.acquire() as conn:
            await ledger.complete(conn, Key(PROVIDER, f"msg_{i}"), 1, done, clock.now)
    clock.advance(3601)  # past the 3600 s window of dead_claim
    report = await rx.sweep(batch=10)
    assert report.deleted == 25
    async with store.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM receiver_receipts") == 0


async def test_a_stale_claim_is_recovered_not_dropped_when_it_expires(store: Store) -> None:
    """An in-flight receipt was never acknowledged: deleting it at expiry would lose the event."""
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    await dead_claim(store, "msg_1", body_of("order.created"), clock.now)
    clock.advance(3601)
    report = await rx.sweep()
    assert (report.recovered, report.deleted) == (1, 0)
    assert runs == ["order msg_1 2"]


async def test_two_sweepers_do_each_receipt_once(pg_store: PostgresStore) -> None:
    clock = Clock()
    first, runs_a = build(pg_store, clock)
    second, runs_b = build(pg_store, clock)
    await first.open()
    await second.open()
    for i in range(30):
        await dead_claim(pg_store, f"msg_{i}", body_of("order.created", i=i), clock.now)
    clock.advance(LEASE + 1)
    a, b = await asyncio.gather(first.sweep(), second.sweep())
    assert a.recovered + b.recovered == 30
    assert len(runs_a) + len(runs_b) == 30
    assert await effects(pg_store) == 30


async def test_a_pass_stops_at_a_batch_that_was_all_left_to_others(store: Store) -> None:
    """A sweeper without the webhooks' handlers (an executor's or a middleware's) leaves their
    stale receipts to the Receiver: a full batch of them ends the pass, counted once."""
    clock = Clock()
    rx, _ = build(store, clock)
    await rx.open()
    for n in (1, 2):
        await dead_claim(store, f"msg_{n}", body_of("order.created"), clock.now)
    clock.advance(LEASE + 1)
    report = await shared_sweep(store, None, now=clock.now, batch=2)
    assert (report.skipped, report.recovered) == (2, 0)


async def test_a_pass_out_of_time_stops_recovering_and_still_reports(store: Store) -> None:
    clock = Clock()
    rx, runs = build(store, clock)
    await rx.open()
    for n in (1, 2):
        await dead_claim(store, f"msg_{n}", body_of("order.created"), clock.now)
    clock.advance(LEASE + 1)
    report = await webhook_sweep(
        store, rx.pipeline, rx.providers, now=clock.now, batch=1, budget=0.0
    )
    # One batch, then the budget is spent: the other stale receipt waits for the next pass.
    assert report == SweepReport(recovered=1)
    assert runs == ["order msg_1 2"]


async def test_keys_this_sweep_does_not_recover_are_left_as_they_are(store: Store) -> None:
    """An action's stale key belongs to its executor's sweeper, and an Idempotency-Key that
    another attempt took over first is that attempt's: both counted as skipped, untouched."""
    clock = Clock()
    rx, _ = build(store, clock)
    await rx.open()
    action, idem = Key("action:refund", "tenant-1/a-1"), Key("idem:tenant-1", "POST /o k-1")
    async with store.acquire() as conn:
        for key in (action, idem):
            claim = Claim(key, b"h" * 32, None, b"{}", clock.now, LEASE, 3600)
            assert isinstance(await ledger.claim(conn, claim), ledger.Claimed)
    clock.advance(LEASE + 1)
    async with store.acquire() as conn:
        seen = await ledger.lookup(conn, idem)
        assert seen is not None
        taken = Claim(idem, b"h" * 32, None, b"{}", clock.now, LEASE, 3600)
        assert await ledger.reclaim(conn, taken, seen.fence) == 2  # a retry took it over
    assert await _recover_keyed(store, seen, "idem", {}) == "skipped"
    assert await rx.sweep() == SweepReport(skipped=1)  # the action's key
    async with store.acquire() as conn:
        for key, fence in ((action, 1), (idem, 2)):
            found = await ledger.lookup(conn, key)
            assert found is not None
            assert (found.state, found.fence) == ("in_flight", fence)
