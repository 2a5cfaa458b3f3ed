"""Proving the shop ships each paid invoice once, with receiver.testing (run: pytest).

The fixtures come from the receiver.testing pytest plugin, installed with receiver:
``receiver_store`` is a throwaway SQLite file, or a throwaway database on the PostgreSQL server
named by ``RECEIVER_TEST_PG_URL``; ``receiver_clock`` is the fake clock that store runs on.
"""

from __future__ import annotations

import pytest
from shop import STRIPE_SECRET, build_receiver

from receiver import Connection
from receiver.testing import (
    Fault,
    Sender,
    assert_count,
    assert_executed_once,
    assert_nothing_in_flight,
    check_redeliveries,
    replay_schedule,
)

SHIPMENTS = "SELECT count(*) FROM shipments WHERE invoice = $1"


@pytest.mark.asyncio
async def test_twenty_concurrent_copies_ship_once(receiver_store, receiver_clock):
    rx = build_receiver(receiver_store, receiver_clock)
    async with rx, Sender(rx, "stripe", STRIPE_SECRET, clock=receiver_clock) as stripe:
        paid = stripe.event("invoice.paid", {"id": "in_1"})
        assert_executed_once(await stripe.twins(paid, 20))
        await assert_count(rx.store, 1, SHIPMENTS, "in_1")


@pytest.mark.asyncio
async def test_stripe_retries_for_three_days_after_a_crash(receiver_store, receiver_clock):
    rx = build_receiver(receiver_store, receiver_clock)
    async with rx, Sender(rx, "stripe", STRIPE_SECRET, clock=receiver_clock) as stripe:
        paid = stripe.event("invoice.paid", {"id": "in_2"})
        # The first attempt dies before its transaction commits; Stripe retries at 1 h, 3 h,
        # ... 72 h, and a person presses "resend" later: shipped exactly once.
        await replay_schedule(stripe, paid, receiver_clock, first=Fault.BEFORE_COMMIT)
        await assert_count(rx.store, 1, SHIPMENTS, "in_2")
        await assert_nothing_in_flight(rx.store)


async def never_twice(conn: Connection) -> None:
    twice = await conn.fetch("SELECT invoice FROM shipments GROUP BY invoice HAVING count(*) > 1")
    assert not twice, f"shipped twice: {[r['invoice'] for r in twice]}"


def test_any_redelivery_order_ships_once(receiver_stores):
    check_redeliveries(
        build_receiver,
        "stripe",
        STRIPE_SECRET,
        [("invoice.paid", {"id": "in_3"}), ("invoice.paid", {"id": "in_4"})],
        invariant=never_twice,
        stores=receiver_stores,
        max_examples=20,
    )
