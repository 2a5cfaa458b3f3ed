"""What planners do to one set of actions, as data; playing it against the user's executor on a
real store; and the hypothesis strategy and property test built on it.

A step prints short, so that a shrunk failure reads as a story: ``execute(a0, before_commit)``,
``regenerate(a1)``, ``restart(a0)``, ``concurrent(a0, 3)``, ``planners(a1, 2)``,
``wait(lease)``, ``sweep()``. After every step the kit checks what holds for any tool (each
action ran to a stored result at most once, every replay repeats it byte for byte, no
proposal of the same action was refused as another) and then the user's own invariant. At the
end every lease is let expire, the sweeper runs, each action is executed once more, and none
may be left in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from .. import Action, Actions, ConfigurationError, State, Store
from ._actions import Attempt, Planner, check_attempts, concurrently, lease_of
from ._assertions import _table
from ._clock import FakeClock
from ._faults import Fault
from ._property import built, property_settings, refuse_running_loop
from ._steps import Invariant, Sweep, Wait
from ._stores import TestStores, temporary_directory

#: The faults drawn by default. BEFORE_COMMIT and AFTER_EXTERNAL_CALL strike at one point (the
#: tool returned, its result is not stored yet): what that point means for each kind of tool.
ACTION_FAULTS = (
    Fault.HANDLER_ERROR,
    Fault.BEFORE_COMMIT,
    Fault.AFTER_EXTERNAL_CALL,
    Fault.AFTER_CLAIM,
)

#: ``build(store, clock)``: the user's executor with its tools registered, on ``store``
#: (already open), its leases on ``clock``. An ``async def`` may create its tables first.
BuildActions = Callable[[Store, FakeClock], Actions | Awaitable[Actions]]

#: ``(tool, action_id, request)``: an action as the system proposes it.
Proposal = tuple[str, str, Mapping[str, Any]]


def _fault(fault: Fault | None) -> str:
    return "" if fault is None else ", " + fault.value


@dataclass(frozen=True, slots=True)
class Execute:
    """The current planner executes action ``action`` (again: a retry); ``fault`` strikes this
    attempt if it runs the tool."""

    action: int
    fault: Fault | None = None

    def __repr__(self) -> str:
        return f"execute(a{self.action}{_fault(self.fault)})"


@dataclass(frozen=True, slots=True)
class Regenerate:
    """The model regenerated its answer: the same action proposed with its prose reworded, and
    executed; ``fault`` strikes this attempt if it runs the tool."""

    action: int
    fault: Fault | None = None

    def __repr__(self) -> str:
        return f"regenerate(a{self.action}{_fault(self.fault)})"


@dataclass(frozen=True, slots=True)
class Restart:
    """The planner process restarts (a new executor, an empty replay cache) and proposes
    ``action`` again from its persisted state, then executes it."""

    action: int

    def __repr__(self) -> str:
        return f"restart(a{self.action})"


@dataclass(frozen=True, slots=True)
class Concurrent:
    """``copies`` concurrent executions of ``action`` by the current planner, through one
    barrier (an SDK's parallel tool calls, a double-clicked retry)."""

    action: int
    copies: int

    def __repr__(self) -> str:
        return f"concurrent(a{self.action}, {self.copies})"


@dataclass(frozen=True, slots=True)
class Planners:
    """``count`` planners (each an executor of its own, as processes are) execute ``action``
    at once, through one barrier."""

    action: int
    count: int

    def __repr__(self) -> str:
        return f"planners(a{self.action}, {self.count})"


ActionStep = Execute | Regenerate | Restart | Concurrent | Planners | Wait | Sweep

_RECOVERY = "after the recovery (wait(lease), sweep(), then each action executed once more)"
_DONE = ("executed", "replayed", "action_failed", "needs_review")


class _Run:
    """The planners of one played history: the current one, and the others of concurrent
    steps, each built by the user's factory as a process would be."""

    def __init__(
        self,
        build: BuildActions,
        store: Store,
        clock: FakeClock,
        scope: str,
        reworded: Mapping[str, Sequence[str]] | None,
    ) -> None:
        self.build, self.store, self.clock, self.scope = build, store, clock, scope
        self.reworded = reworded
        self.numbers = 0
        self.current: Planner
        self.others: list[Planner] = []

    async def planner(self) -> Planner:
        self.numbers += 1
        actions = await built(self.build(self.store, self.clock))
        if not isinstance(actions, Actions):
            raise ConfigurationError(f"build(store, clock) must return Actions, not {actions!r}")
        return Planner(actions, scope=self.scope, number=self.numbers)

    async def planners(self, count: int) -> list[Planner]:
        while len(self.others) < count - 1:
            self.others.append(await self.planner())
        return [self.current, *self.others[: count - 1]]

    def fields(self, action: Action) -> Sequence[str] | None:
        return None if self.reworded is None else self.reworded.get(action.tool, ())


async def play_actions(
    build: BuildActions,
    store: Store,
    clock: FakeClock,
    proposals: Sequence[Proposal],
    steps: Sequence[ActionStep],
    *,
    scope: str = "tenant-1",
    reworded: Mapping[str, Sequence[str]] | None = None,
    invariant: Invariant | None = None,
    final: Invariant | None = None,
) -> dict[str, list[Attempt]]:
    """Play ``steps`` over ``proposals`` against executors ``build`` makes on the open
    ``store``, checking after each; then recover and check that no action is left in flight
    and that ``final`` holds. ``reworded``: the fields a regeneration rewords, by tool (by
    default each tool's ``volatile`` fields)."""
    run = _Run(build, store, clock, scope, reworded)
    run.current = await run.planner()
    actions = [
        run.current.propose(tool, action_id, request) for tool, action_id, request in proposals
    ]
    lease = max(lease_of(run.current.actions, a.tool) for a in actions)
    history: dict[str, list[Attempt]] = {a.key: [] for a in actions}
    done: list[ActionStep] = []

    async def check(where: str) -> None:
        try:
            for key, attempts in history.items():
                check_attempts(key, attempts)
            if invariant is not None:
                async with store.acquire() as conn:
                    await invariant(conn)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{where}; steps: {done!r}") from exc

    for step in steps:
        done.append(step)
        if isinstance(step, Wait):
            clock.advance(lease + 1 if step.span == "lease" else 1.0)
        elif isinstance(step, Sweep):
            await run.current.actions.sweep()
        else:
            action = actions[step.action]
            history[action.key].extend(await _step(run, step, action))
        await check(f"after {step!r}")

    # Recovery: every lease runs out, the sweeper passes, the planner executes each action again.
    clock.advance(lease + 1)
    await run.current.actions.sweep()
    for action in actions:
        history[action.key].append(await run.current.execute(run.current.restore(action)))
    await check(_RECOVERY)
    try:
        for action in actions:
            await _settled(run.current, action, history[action.key])
        if final is not None:
            async with store.acquire() as conn:
                await final(conn)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_RECOVERY}; steps: {list(steps)!r}") from exc
    return history


async def _step(run: _Run, step: ActionStep, action: Action) -> list[Attempt]:
    planner = run.current
    if isinstance(step, Execute):
        return [await planner.execute(planner.restore(action), fault=step.fault)]
    if isinstance(step, Regenerate):
        again = planner.regenerate(action, run.fields(action))
        return [await planner.execute(again, fault=step.fault)]
    if isinstance(step, Restart):
        run.current = await run.planner()
        return [await run.current.execute(run.current.restore(action))]
    if isinstance(step, Concurrent):
        return await concurrently([planner] * step.copies, planner.restore(action))
    assert isinstance(step, Planners)
    return await concurrently(await run.planners(step.count), planner.restore(action))


async def _settled(planner: Planner, action: Action, attempts: Sequence[Attempt]) -> None:
    """After the recovery: the action has its final answer, and its key is out of flight."""
    state = await planner.actions.inspect(action)
    if state is not None and state.state is State.IN_FLIGHT:
        raise AssertionError(f"{action.key}: left in flight:\n{_table(attempts)}")
    if attempts[-1].outcome not in _DONE:
        raise AssertionError(
            f"{action.key}: no stored answer after the recovery ({attempts[-1].outcome}):\n"
            + _table(attempts)
        )


def replans(
    actions: int,
    *,
    max_steps: int = 12,
    faults: Sequence[Fault] = ACTION_FAULTS,
    max_copies: int = 4,
    max_planners: int = 3,
) -> st.SearchStrategy[list[ActionStep]]:
    """Random histories over ``actions`` actions: retries, regenerations, planner restarts,
    concurrent copies and planners, crashes and failures, lease expiries and sweeper passes.
    Shrinks towards fewer, plainer steps."""
    if actions < 1:
        raise ConfigurationError("replans needs at least one action")
    if max_copies < 2 or max_planners < 2:
        raise ConfigurationError("max_copies and max_planners must be at least 2")
    index = st.integers(min_value=0, max_value=actions - 1)
    fault = st.none() | st.sampled_from(list(faults)) if faults else st.none()
    step: st.SearchStrategy[ActionStep] = st.one_of(
        st.builds(Execute, index, fault),
        st.builds(Regenerate, index, fault),
        st.builds(Restart, index),
        st.builds(Concurrent, index, st.integers(min_value=2, max_value=max_copies)),
        st.builds(Planners, index, st.integers(min_value=2, max_value=max_planners)),
        st.builds(Wait, st.sampled_from(["moment", "lease"])),
        st.just(Sweep()),
    )
    return st.lists(step, min_size=1, max_size=max_steps)


def check_actions(
    build: BuildActions,
    proposals: Sequence[Proposal],
    *,
    scope: str = "tenant-1",
    reworded: Mapping[str, Sequence[str]] | None = None,
    invariant: Invariant | None = None,
    final: Invariant | None = None,
    stores: TestStores | None = None,
    faults: Sequence[Fault] = ACTION_FAULTS,
    max_steps: int = 12,
    max_examples: int = 25,
) -> None:
    """Property test: for random histories of ``proposals`` (``(tool, action_id, request)``),
    the user's executor (``build(store, clock)`` makes it, once per planner) keeps
    ``invariant`` after every step and, once everything is recovered, ``final``. On failure
    hypothesis shrinks the history and the error shows the steps that broke it.

    Call it from a plain (not async) test: each example runs in its own event loop, on a fresh
    store from ``stores`` (the ``receiver_stores`` fixture; a throwaway SQLite file if None).
    ``max_examples`` is raised to the profile's count under ``--hypothesis-profile=deep``.
    """
    refuse_running_loop("check_actions")
    if not proposals:
        raise ConfigurationError("check_actions needs at least one proposal")
    with temporary_directory() as tmp:
        source = stores if stores is not None else TestStores(Path(tmp))

        async def example(history: list[ActionStep]) -> None:
            clock = FakeClock()
            store = await source.fresh(clock)
            async with store:
                await play_actions(
                    build,
                    store,
                    clock,
                    proposals,
                    history,
                    scope=scope,
                    reworded=reworded,
                    invariant=invariant,
                    final=final,
                )

        # A test function of its own (not shared with check_requests): hypothesis keys its
        # database of failing examples by the function's source.
        @property_settings(max_examples)
        @given(history=replans(len(proposals), max_steps=max_steps, faults=faults))
        def replanned(history: list[ActionStep]) -> None:
            asyncio.run(example(history))

        replanned()
