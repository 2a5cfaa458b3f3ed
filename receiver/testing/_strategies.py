"""Hypothesis strategies for redelivery orders, and the property test that plays them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .._exceptions import ConfigurationError
from .._store.base import Store
from .._webhooks.app import Receiver
from ._clock import FakeClock
from ._faults import Fault
from ._sender import Sender
from ._steps import Deliver, Invariant, Step, Sweep, Twins, Wait, play
from ._stores import TestStores, temporary_directory

#: Examples per property in a deep run (``--hypothesis-profile=deep``).
DEEP_EXAMPLES = 500

#: The faults drawn by default: every kind a transactional handler can meet.
TRANSACTIONAL_FAULTS = (Fault.HANDLER_ERROR, Fault.BEFORE_COMMIT, Fault.AFTER_CLAIM)

Build = Callable[[Store, FakeClock], Receiver]


def steps(
    events: int,
    *,
    faults: Sequence[Fault] = TRANSACTIONAL_FAULTS,
    max_copies: int = 4,
) -> st.SearchStrategy[Step]:
    """One step over ``events`` events: a delivery (sometimes with a fault), concurrent twins,
    time passing (a moment, or past every lease) or a sweeper pass."""
    event = st.integers(min_value=0, max_value=events - 1)
    fault = st.none() | st.sampled_from(list(faults)) if faults else st.none()
    return st.one_of(
        st.builds(Deliver, event, fault),
        st.builds(Twins, event, st.integers(min_value=2, max_value=max_copies)),
        st.builds(Wait, st.sampled_from(["moment", "lease"])),
        st.just(Sweep()),
    )


def redeliveries(
    events: int,
    *,
    max_steps: int = 12,
    faults: Sequence[Fault] = TRANSACTIONAL_FAULTS,
    max_copies: int = 4,
) -> st.SearchStrategy[list[Step]]:
    """Random redelivery orders over ``events`` events: duplicates, interleavings, failures,
    crashes and lease expiries. Shrinks towards fewer, plainer steps."""
    if events < 1:
        raise ConfigurationError("redeliveries needs at least one event")
    return st.lists(
        steps(events, faults=faults, max_copies=max_copies), min_size=1, max_size=max_steps
    )


def examples(normal: int) -> int:
    """``normal`` examples, or the loaded profile's count when a deep run asked for more."""
    loaded = settings().max_examples  # a settings() object inherits the loaded profile
    return max(normal, loaded) if loaded >= DEEP_EXAMPLES else normal


def register_profiles() -> None:
    """Register the ``deep`` hypothesis profile: ``pytest --hypothesis-profile=deep``."""
    settings.register_profile(
        "deep",
        max_examples=DEEP_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def check_redeliveries(
    build: Build,
    provider: str,
    secret: str | bytes,
    events: Sequence[tuple[str, Any]],
    *,
    invariant: Invariant | None = None,
    final: Invariant | None = None,
    stores: TestStores | None = None,
    faults: Sequence[Fault] = TRANSACTIONAL_FAULTS,
    max_steps: int = 12,
    max_examples: int = 25,
) -> None:
    """Property test: for random redelivery orders of ``events`` (``(type, data)`` pairs),
    the user's Receiver (``build(store, clock)`` makes it) keeps ``invariant`` after every
    step and, once everything is recovered, ``final``. On failure hypothesis shrinks the
    order and the error shows the steps that broke it.

    Call it from a plain (not async) test: each example runs in its own event loop, on a fresh
    store from ``stores`` (the ``receiver_stores`` fixture; a throwaway SQLite file if None).
    ``max_examples`` is raised to the profile's count under ``--hypothesis-profile=deep``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ConfigurationError(
            "check_redeliveries runs an event loop per example: call it from a plain `def` "
            "test, not an `async def` one"
        )
    with temporary_directory() as tmp:
        source = stores if stores is not None else TestStores(Path(tmp))

        async def example(order: list[Step]) -> None:
            clock = FakeClock()
            rx = build(await source.fresh(clock), clock)
            async with rx, Sender(rx, provider, secret, clock=clock) as sender:
                webhooks = [sender.event(kind, data) for kind, data in events]
                await play(rx, sender, clock, webhooks, order, invariant=invariant, final=final)

        @settings(
            max_examples=examples(max_examples),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(order=redeliveries(len(events), max_steps=max_steps, faults=faults))
        def redelivered(order: list[Step]) -> None:
            asyncio.run(example(order))

        redelivered()
