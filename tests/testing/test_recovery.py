"""Crashes and schedules on the fake clock: a death before commit or after an external call,
recovered by a redelivery, the sweeper or reconcile; the provider's retry schedule and a late
"resend" across the lease and the dedup window, on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from receiver import ConfigurationError, Connection, Event, Provider, Receiver
from receiver.testing import (
    FakeClock,
    Fault,
    Faults,
    Sender,
    TestStores,
    assert_count,
    assert_nothing_in_flight,
    replay_schedule,
)
from tests.testing.app import STANDARD, STRIPE, build

HOUR = 3600.0
DAY = 24 * HOUR
ROWS = "SELECT count(*) FROM kit_orders WHERE webhook_id = $1"


async def test_a_crash_before_commit_is_recovered_by_the_retry(kit_stores: TestStores) -> None:
    clock = FakeClock()
    rx = build(await kit_stores.fresh(clock), clock)
    async with rx, Sender(rx, "acme", STANDARD, clock=clock) as sender:
        webhook = sender.event("order.created", {"order": "o-1"})
        run = await replay_schedule(sender, webhook, clock, first=Fault.BEFORE_COMMIT)
        outcomes = [d.outcome for d in run.deliveries]
        # svix: 0, +5 s (the dead attempt's lease is live: 409), +5 min (expired: run again).
        assert outcomes[:3] == ["died", "in_flight", "executed"], run.deliveries
        assert set(outcomes[3:]) == {"replayed"}, run.deliveries
        await assert_count(rx.store, 1, ROWS, webhook.id)
        await assert_nothing_in_flight(rx.store)


async def test_the_sweeper_recovers_a_crash_nobody_redelivers(kit_stores: TestStores) -> None:
    clock = FakeClock()
    rx = build(await kit_stores.fresh(clock), clock)
    async with rx, Sender(rx, "acme", STANDARD, clock=clock) as sender:
        webhook = sender.event("order.created", {"order": "o-1"})
        Faults.of(rx).arm(webhook.id, Fault.AFTER_CLAIM)
        assert (await sender.send(webhook)).outcome == "died"
        await assert_count(rx.store, 0, ROWS, webhook.id)
        with pytest.raises(AssertionError, match="left in flight"):
            await assert_nothing_in_flight(rx.store)
        clock.advance(61)
        report = await rx.sweep()
        assert report.recovered == 1
        await assert_nothing_in_flight(rx.store)
        await assert_count(rx.store, 1, ROWS, webhook.id)
        assert (await sender.send(webhook)).outcome == "replayed"


@pytest.mark.parametrize("reconciles", [True, False])
async def test_an_external_call_is_reconciled_never_repeated(
    kit_stores: TestStores, reconciles: bool
) -> None:
    calls: list[str] = []
    clock = FakeClock()
    rx = Receiver(
        await kit_stores.fresh(clock),
        [Provider("pay", [STANDARD])],
        clock=clock,
        sweep_interval=None,
    )

    async def ask_the_bank(event: Event) -> Any:
        return {"charged": calls.count(event.id)}

    @rx.on("payment.created", effects="external", reconcile=ask_the_bank if reconciles else None)
    async def charge(event: Event, tx: Connection) -> Any:
        calls.append(event.id)  # the outside world: it happened, whatever comes next
        return {"charged": 1}

    async with rx, Sender(rx, "pay", STANDARD, clock=clock) as sender:
        webhook = sender.event("payment.created", {"amount": 4200})
        run = await replay_schedule(sender, webhook, clock, first=Fault.AFTER_EXTERNAL_CALL)
        assert calls == [webhook.id]  # never re-run blindly
        recovered = run.deliveries[2]
        if reconciles:
            assert (recovered.outcome, recovered.body) == ("executed", b'{"charged":1}')
        else:
            assert recovered.outcome == "needs_review"
        await assert_nothing_in_flight(rx.store)


async def test_stripes_day_three_retry_and_a_resend_later(kit_stores: TestStores) -> None:
    clock = FakeClock()
    rx = build(await kit_stores.fresh(clock), clock)
    async with rx, Sender(rx, "stripe", STRIPE, clock=clock) as sender:
        webhook = sender.event("invoice.paid", {"invoice": "in_1"})
        run = await replay_schedule(sender, webhook, clock)
        assert run.offsets[-3:] == (72 * HOUR, 73 * HOUR, 95 * HOUR)
        assert run.executions == 1
        await assert_count(rx.store, 1, ROWS, webhook.id)
        # The default window is the 3-day span plus a day: a resend a full day after the last
        # retry is at its edge, and runs again. The kit shows it.
        with pytest.raises(AssertionError, match="ran its handlers 2 times"):
            await replay_schedule(sender, sender.event("invoice.paid"), clock, resend_after=[DAY])


async def test_a_too_short_ttl_is_caught(kit_stores: TestStores) -> None:
    clock = FakeClock()
    # Accepted at start-up (longer than Stripe's 3-day span), but a "resend" a day after the
    # last retry comes after the receipt expired.
    rx = build(await kit_stores.fresh(clock), clock, stripe_ttl=73 * HOUR)
    async with rx, Sender(rx, "stripe", STRIPE, clock=clock) as sender:
        webhook = sender.event("invoice.paid", {"invoice": "in_1"})
        with pytest.raises(AssertionError, match=r"ran its handlers 2 times.*raise the provider"):
            await replay_schedule(sender, webhook, clock)


async def test_a_schedule_is_replayed_in_process_only() -> None:
    async with Sender("http://127.0.0.1:9", "stripe", STRIPE, scheme="stripe") as sender:
        with pytest.raises(ConfigurationError, match="in this process"):
            await replay_schedule(sender, sender.event("invoice.paid"), FakeClock())
