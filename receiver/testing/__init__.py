"""receiver.testing: prove that your own handlers, tools and keyed endpoints run once.

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

For an agent's tools (:class:`~receiver.Actions`):

- :class:`Planner`: executes your actions as a planner does and records each
  :class:`Attempt`; ``twins`` races copies, ``regenerate`` rewords the model's prose,
  ``restore`` proposes an action again after a restart; :func:`concurrently` runs planners.
- :class:`ToolFaults` (or ``execute(..., fault=)``) and :func:`crash_and_recover`: a death
  after the external call, recovered by the retry, the sweeper or reconcile.
- :func:`replans` / :func:`check_actions`: retries, restarts, regenerations and concurrent
  planners against your invariant, shrunk to the steps that break it.
- :func:`crash_and_resume`: under a durable-execution runtime (DBOS, Prefect, Pydantic AI's
  durable agents), a death after the tool's effect and before the runtime recorded the step,
  then the runtime's own recovery.

For endpoints behind the :class:`~receiver.IdempotencyKeyMiddleware`:

- :class:`Client`: keyed requests to your ASGI app, in-process; ``send``, ``copies``,
  ``drop`` (the client hangs up and retries), :func:`reserialize` (another client library's
  bytes for the same JSON); :class:`EndpointFaults` (or ``send(..., fault=)``).
- :func:`resends` / :func:`check_requests`: the same, at random, against your invariant.
"""

from .._verification.sending import SCHEMES, Webhook
from ._action_steps import (
    ACTION_FAULTS,
    ActionStep,
    BuildActions,
    Concurrent,
    Execute,
    Planners,
    Proposal,
    Regenerate,
    Restart,
    check_actions,
    play_actions,
    replans,
)
from ._actions import (
    Attempt,
    Planner,
    Recovery,
    ToolFaults,
    check_attempts,
    concurrently,
    crash_and_recover,
)
from ._assertions import (
    Attempted,
    assert_count,
    assert_executed_once,
    assert_nothing_in_flight,
    assert_replayed,
    count,
    in_flight,
)
from ._clock import FakeClock
from ._faults import Fault, Faults, InjectedFailure, SimulatedCrash
from ._idempotency import (
    STYLES,
    Answer,
    Client,
    EndpointFaults,
    KeyedRequest,
    reserialize,
)
from ._request_steps import (
    REQUEST_FAULTS,
    BuildApp,
    Call,
    Copies,
    Drop,
    RequestStep,
    Reserialize,
    Send,
    check_answers,
    check_requests,
    play_requests,
    resends,
)
from ._runtime import RUNTIME_FAULTS, Resumed, crash_and_resume
from ._schedule import ScheduleRun, replay_schedule
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
    "ACTION_FAULTS",
    "DEEP_EXAMPLES",
    "PG_URL_VARIABLE",
    "REQUEST_FAULTS",
    "RUNTIME_FAULTS",
    "SCHEMES",
    "STYLES",
    "ActionStep",
    "Answer",
    "Attempt",
    "Attempted",
    "BuildActions",
    "BuildApp",
    "Call",
    "Client",
    "Concurrent",
    "Copies",
    "Deliver",
    "Delivery",
    "Drop",
    "EndpointFaults",
    "Execute",
    "FakeClock",
    "Fault",
    "Faults",
    "InjectedFailure",
    "Invariant",
    "KeyedRequest",
    "Planner",
    "Planners",
    "Proposal",
    "Recovery",
    "Regenerate",
    "RequestStep",
    "Reserialize",
    "Restart",
    "Resumed",
    "ScheduleRun",
    "Send",
    "Sender",
    "SimulatedCrash",
    "Step",
    "Sweep",
    "TestStores",
    "ToolFaults",
    "Twins",
    "Wait",
    "Webhook",
    "assert_count",
    "assert_executed_once",
    "assert_nothing_in_flight",
    "assert_replayed",
    "check_actions",
    "check_answers",
    "check_attempts",
    "check_history",
    "check_redeliveries",
    "check_requests",
    "concurrently",
    "count",
    "crash_and_recover",
    "crash_and_resume",
    "examples",
    "in_flight",
    "play",
    "play_actions",
    "play_requests",
    "redeliveries",
    "register_profiles",
    "replans",
    "replay_schedule",
    "resends",
    "reserialize",
    "steps",
]
