"""What clients do with keyed requests, as data; playing it against the user's ASGI app behind
the Idempotency-Key middleware; and the hypothesis strategy and property test built on it.

A step prints short: ``send(r0, before_commit)``, ``copies(r1, 3)``, ``drop(r0)``,
``reserialize(r0, pretty)``, ``wait(lease)``, ``sweep()``. After every step the kit checks what
holds for any endpoint (each request ran to a stored answer at most once, every replay repeats
it byte for byte, the same request was never refused as another: a re-serialized JSON body is
the same request) and then the user's own invariant. At the end every lease is let expire,
the middleware's sweeper runs, each request is sent once more, and none may be left in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from starlette.types import ASGIApp

from .. import ConfigurationError, Store
from ._assertions import _table, in_flight
from ._clock import FakeClock
from ._faults import Fault
from ._idempotency import STYLES, Answer, Client, KeyedRequest, reserialize
from ._property import built, property_settings, refuse_running_loop
from ._steps import Invariant, Sweep, Wait
from ._stores import TestStores, temporary_directory

#: The faults drawn by default: the same points as a tool's (the endpoint answered, its answer
#: is not stored yet: BEFORE_COMMIT for its ``tx`` writes, AFTER_EXTERNAL_CALL for the rest).
REQUEST_FAULTS = (
    Fault.HANDLER_ERROR,
    Fault.BEFORE_COMMIT,
    Fault.AFTER_EXTERNAL_CALL,
    Fault.AFTER_CLAIM,
)

#: ``build(store, clock)``: the user's ASGI app with the IdempotencyKeyMiddleware on ``store``
#: (already open; its leases on ``clock``). An ``async def`` may create its tables first.
BuildApp = Callable[[Store, FakeClock], ASGIApp | Awaitable[ASGIApp]]

#: ``(method, path, json)``: a request as a client sends it.
Call = tuple[str, str, Any]


@dataclass(frozen=True, slots=True)
class Send:
    """The client sends request ``request`` (again: a retry with the same key); ``fault``
    strikes it if it reaches the endpoint."""

    request: int
    fault: Fault | None = None

    def __repr__(self) -> str:
        fault = "" if self.fault is None else ", " + self.fault.value
        return f"send(r{self.request}{fault})"


@dataclass(frozen=True, slots=True)
class Copies:
    """``copies`` concurrent sends of ``request``, through one barrier."""

    request: int
    copies: int

    def __repr__(self) -> str:
        return f"copies(r{self.request}, {self.copies})"


@dataclass(frozen=True, slots=True)
class Drop:
    """The client hangs up before the answer and retries at once, while the first still runs."""

    request: int

    def __repr__(self) -> str:
        return f"drop(r{self.request})"


@dataclass(frozen=True, slots=True)
class Reserialize:
    """The same request with the same key, its JSON body written by another client library
    (``style``: one of `STYLES`)."""

    request: int
    style: str

    def __repr__(self) -> str:
        return f"reserialize(r{self.request}, {self.style})"


RequestStep = Send | Copies | Drop | Reserialize | Wait | Sweep

_RECOVERY = "after the recovery (wait(lease), sweep(), then each request sent once more)"


def check_answers(key: str, answers: Sequence[Answer]) -> None:
    """What holds for any endpoint: it ran to a stored answer at most once, every replay
    repeats that answer byte for byte, and the same request was never refused as another."""
    executed = [a for a in answers if a.outcome == "executed"]
    if len(executed) > 1:
        raise AssertionError(
            f"{key}: the endpoint ran to a stored answer {len(executed)} times:\n" + _table(answers)
        )
    stored = {a.answer for a in answers if a.outcome in ("executed", "replayed")}
    if len(stored) > 1:
        raise AssertionError(f"{key}: the replays are not byte-identical:\n" + _table(answers))
    if any(a.outcome == "mismatch" for a in answers):
        raise AssertionError(
            f"{key}: the same request, sent again, was refused as another (422):\n"
            + _table(answers)
        )


async def play_requests(
    client: Client,
    clock: FakeClock,
    requests: Sequence[KeyedRequest],
    steps: Sequence[RequestStep],
    *,
    invariant: Invariant | None = None,
    final: Invariant | None = None,
) -> dict[str, list[Answer]]:
    """Play ``steps`` over ``requests`` through the open ``client``, checking after each; then
    recover and check that no key is left in flight and that ``final`` holds."""
    middleware = client.middleware
    keys = [r.key for r in requests]
    if None in keys or len(set(keys)) != len(keys):
        raise ConfigurationError("each request needs an Idempotency-Key of its own")
    history: dict[str, list[Answer]] = {str(r.key): [] for r in requests}
    done: list[RequestStep] = []

    async def check(where: str) -> None:
        try:
            for key, answers in history.items():
                check_answers(key, answers)
            if invariant is not None:
                async with middleware.store.acquire() as conn:
                    await invariant(conn)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{where}; steps: {done!r}") from exc

    for step in steps:
        done.append(step)
        if isinstance(step, Wait):
            clock.advance(middleware.lease + 1 if step.span == "lease" else 1.0)
        elif isinstance(step, Sweep):
            await middleware.sweep()
        else:
            request = requests[step.request]
            history[str(request.key)].extend(await _step(client, step, request))
        await check(f"after {step!r}")

    # Recovery: every lease runs out, the sweeper passes, the client retries each request.
    clock.advance(middleware.lease + 1)
    await middleware.sweep()
    for request in requests:
        history[str(request.key)].append(await client.send(request))
    await check(_RECOVERY)
    try:
        left = await in_flight(middleware.store, middleware.provider)
        if left:
            raise AssertionError(f"{len(left)} key(s) left in flight: " + ", ".join(left[:20]))
        for key, answers in history.items():
            if answers[-1].outcome not in ("executed", "replayed"):
                raise AssertionError(
                    f"{key}: no stored answer after the recovery:\n" + _table(answers)
                )
        if final is not None:
            async with middleware.store.acquire() as conn:
                await final(conn)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_RECOVERY}; steps: {list(steps)!r}") from exc
    return history


async def _step(client: Client, step: RequestStep, request: KeyedRequest) -> list[Answer]:
    if isinstance(step, Send):
        return [await client.send(request, fault=step.fault)]
    if isinstance(step, Copies):
        return await client.copies(request, step.copies)
    if isinstance(step, Drop):
        return await client.drop(request)
    assert isinstance(step, Reserialize)
    return [await client.send(reserialize(request, step.style))]


def resends(
    requests: int,
    *,
    max_steps: int = 12,
    faults: Sequence[Fault] = REQUEST_FAULTS,
    max_copies: int = 4,
) -> st.SearchStrategy[list[RequestStep]]:
    """Random retries of ``requests`` keyed requests: the same key again, concurrent copies,
    dropped connections, re-serialized bodies, crashes and failures, lease expiries and
    sweeper passes. Shrinks towards fewer, plainer steps."""
    if requests < 1:
        raise ConfigurationError("resends needs at least one request")
    index = st.integers(min_value=0, max_value=requests - 1)
    fault = st.none() | st.sampled_from(list(faults)) if faults else st.none()
    step: st.SearchStrategy[RequestStep] = st.one_of(
        st.builds(Send, index, fault),
        st.builds(Copies, index, st.integers(min_value=2, max_value=max_copies)),
        st.builds(Drop, index),
        st.builds(Reserialize, index, st.sampled_from(STYLES)),
        st.builds(Wait, st.sampled_from(["moment", "lease"])),
        st.just(Sweep()),
    )
    return st.lists(step, min_size=1, max_size=max_steps)


def check_requests(
    build: BuildApp,
    requests: Sequence[Call],
    *,
    headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    invariant: Invariant | None = None,
    final: Invariant | None = None,
    stores: TestStores | None = None,
    faults: Sequence[Fault] = REQUEST_FAULTS,
    max_steps: int = 12,
    max_examples: int = 25,
) -> None:
    """Property test: for random retries of ``requests`` (``(method, path, json)``, each with a
    key of its own), the user's app (``build(store, clock)`` makes it) keeps ``invariant``
    after every step and, once everything is recovered, ``final``. ``headers`` go with every
    request (what the app's ``principal`` reads). On failure hypothesis shrinks the retries
    and the error shows the steps that broke it.

    Call it from a plain (not async) test: each example runs in its own event loop, on a fresh
    store from ``stores`` (the ``receiver_stores`` fixture; a throwaway SQLite file if None).
    ``max_examples`` is raised to the profile's count under ``--hypothesis-profile=deep``.
    """
    refuse_running_loop("check_requests")
    if not requests:
        raise ConfigurationError("check_requests needs at least one request")
    with temporary_directory() as tmp:
        source = stores if stores is not None else TestStores(Path(tmp))

        async def example(order: list[RequestStep]) -> None:
            clock = FakeClock()
            store = await source.fresh(clock)
            async with store:
                app = await built(build(store, clock))
                async with Client(app, headers=headers) as client:
                    made = [client.request(path, body, method=m) for m, path, body in requests]
                    await play_requests(
                        client, clock, made, order, invariant=invariant, final=final
                    )

        @property_settings(max_examples)
        @given(order=resends(len(requests), max_steps=max_steps, faults=faults))
        def resent(order: list[RequestStep]) -> None:
            asyncio.run(example(order))

        resent()
