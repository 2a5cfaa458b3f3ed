"""receiver.testing: prove that your own handlers run once.

A pytest plugin (installed with receiver; ``pip install receiver[testing]`` adds hypothesis) and
the pieces it is made of. The kit drives *your* Receiver on a real store with a sender that
signs like your provider, and checks what you care about with your own queries::

    from receiver.testing import Sender, assert_executed_once

    async def test_paid_once(receiver_store, receiver_clock):
        rx = build_receiver(receiver_store, clock=receiver_clock)   # your app's factory
        async with rx, Sender(rx, "stripe", SECRET, clock=receiver_clock) as stripe:
            event = stripe.event("invoice.paid", {"id": "in_1"})
            assert_executed_once(await stripe.twins(event, 20))

- :class:`Sender`: signs deliveries in the provider's scheme (Standard Webhooks v1/v1a, Stripe,
  GitHub, Shopify, Slack); sends them in-process (ASGI) or over HTTP; ``twins`` races copies.
- :class:`FakeClock`: one clock for the Receiver, the store and the sender.
- :func:`replay_schedule`: the provider's retry schedule and a late "resend" on the fake clock.
- :class:`Fault` / :class:`Faults`: a death after the claim, before commit, after an external
  call; a failing handler. Recovery: a redelivery, ``rx.sweep()``, reconcile.
- :func:`redeliveries` / :func:`check_redeliveries`: hypothesis-driven redelivery orders
  against your invariant, shrunk to the steps that break it.
- Assertions: :func:`assert_executed_once`, :func:`assert_replayed`,
  :func:`assert_nothing_in_flight`, :func:`assert_count`.
"""

from ._assertions import (
    assert_count,
    assert_executed_once,
    assert_nothing_in_flight,
    assert_replayed,
    count,
    in_flight,
)
from ._clock import FakeClock
from ._faults import Fault, Faults, InjectedFailure, SimulatedCrash
from ._schedule import ScheduleRun, replay_schedule
from ._schemes import SCHEMES, Webhook
from ._sender import Delivery, Sender
from ._steps import Deliver, Invariant, Step, Sweep, Twins, Wait, check_history, play
from ._stores import PG_URL_VARIABLE, TestStores
from ._strategies import (
    DEEP_EXAMPLES,
    check_redeliveries,
    examples,
    redeliveries,
    register_profiles,
    steps,
)

__all__ = [
    "DEEP_EXAMPLES",
    "PG_URL_VARIABLE",
    "SCHEMES",
    "Deliver",
    "Delivery",
    "FakeClock",
    "Fault",
    "Faults",
    "InjectedFailure",
    "Invariant",
    "ScheduleRun",
    "Sender",
    "SimulatedCrash",
    "Step",
    "Sweep",
    "TestStores",
    "Twins",
    "Wait",
    "Webhook",
    "assert_count",
    "assert_executed_once",
    "assert_nothing_in_flight",
    "assert_replayed",
    "check_history",
    "check_redeliveries",
    "count",
    "examples",
    "in_flight",
    "play",
    "redeliveries",
    "register_profiles",
    "replay_schedule",
    "steps",
]
