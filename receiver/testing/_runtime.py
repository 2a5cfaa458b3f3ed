"""Prove a tool under a durable-execution runtime (DBOS, Prefect, Pydantic AI's durable agents,
your own): the process dies after the tool's effect and before the runtime records the step,
then the runtime's own recovery runs the step again.

    async def test_refund_once_under_dbos(store):
        actions = build_actions(store, lease=1.0)        # your executor, a short lease
        wid = "settle-A-1"

        async def start():
            with SetWorkflowID(wid):
                return await settle("A-1")

        async def resume():
            return await (await DBOS.resume_workflow_async(wid)).get_result()

        resumed = await crash_and_resume(actions, "refund", start, resume)
        assert resumed.body_runs == 1                     # and your own count of refunds

The kit wraps the tool in place (your code is untouched): the first call of it that ``start``
makes dies at ``fault`` with :class:`~receiver.testing.SimulatedCrash`, which nothing in the
executor catches: its transaction rolls back and its claim stays in flight, as after a SIGKILL.
Runtimes leave the step unrecorded (DBOS keeps the workflow pending; Prefect marks the run
crashed). Then the dead attempt's lease runs out (``clock`` moved past it, or the real time
waited) and ``resume`` runs the runtime's recovery.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import Actions, ConfigurationError, KeyState, State, ToolCall
from ._actions import lease_of, tools_of
from ._clock import FakeClock
from ._faults import Fault, SimulatedCrash

#: The faults a runtime's recovery can be driven through: a death before the tool ran, or
#: after it returned (its ``tx`` writes made or its outside call done), before the executor
#: stored its result.
RUNTIME_FAULTS = (Fault.AFTER_CLAIM, Fault.BEFORE_COMMIT, Fault.AFTER_EXTERNAL_CALL)


@dataclass(frozen=True, slots=True)
class Resumed:
    """What the crash and the runtime's recovery did to the tool's action. ``body_runs``: how
    often the tool's body returned (its effect happened), the dying attempt included;
    ``reconciled``: how often its ``reconcile`` was asked; ``keys``: the action keys the tool
    (or its reconcile) was called with, in order; ``state``: what the ledger holds for the
    action afterwards; ``result``: what ``resume`` returned."""

    key: str
    fault: Fault
    crashed: str
    result: Any
    body_runs: int
    reconciled: int
    keys: tuple[str, ...]
    state: KeyState | None


class _Recorder:
    """The tool, wrapped: every call's key recorded, the first one struck by the fault."""

    def __init__(self, fault: Fault) -> None:
        self.fault: Fault | None = fault
        self.keys: list[str] = []
        self.body_runs = 0
        self.reconciled = 0

    def wrap(self, func: Any) -> Any:
        async def recorded(call: ToolCall, tx: Any) -> Any:
            self.keys.append(call.action.key)
            fault, self.fault = self.fault, None
            if fault is Fault.AFTER_CLAIM:
                raise SimulatedCrash(f"{call.action.key}: died after the claim")
            result = await func(call, tx)
            self.body_runs += 1
            if fault is not None:
                raise SimulatedCrash(f"{call.action.key}: died {fault.value.replace('_', ' ')}")
            return result

        return recorded

    def wrap_reconcile(self, func: Any) -> Any:
        async def recorded(call: ToolCall) -> Any:
            self.keys.append(call.action.key)
            self.reconciled += 1
            return await func(call)

        return recorded


async def crash_and_resume(
    actions: Actions,
    tool: str,
    start: Callable[[], Awaitable[Any]],
    resume: Callable[[], Awaitable[Any]],
    *,
    fault: Fault = Fault.AFTER_EXTERNAL_CALL,
    clock: FakeClock | None = None,
    check: bool = True,
) -> Resumed:
    """Run ``start()`` (your runtime's workflow, flow run or agent run) until the first call of
    ``tool`` dies at ``fault``; let that attempt's lease run out; run ``resume()`` (your
    runtime's recovery of it). With ``check`` (the default), raises AssertionError unless the
    recovery asked for the same action (the runtime's key did not change), the action ended
    out of flight, and the tool's body ran to its effect at most once for an external tool (a
    transactional one may run again: its dead attempt's writes rolled back). Your own count
    query says whether the effect itself happened once.

    Use a short lease for the tool in such a test (``Actions(store, lease=1.0)``): without
    ``clock``, the kit waits it out in real time.
    """
    if Fault(fault) not in RUNTIME_FAULTS:
        raise ConfigurationError(f"fault must be one of {[f.value for f in RUNTIME_FAULTS]}")
    tools = tools_of(actions)
    if tool not in tools:
        raise ConfigurationError(f"no tool named {tool!r} on {actions!r}")
    original = tools[tool]
    recorder = _Recorder(Fault(fault))
    reconcile = original.reconcile
    tools[tool] = dataclasses.replace(
        original,
        func=recorder.wrap(original.func),
        reconcile=None if reconcile is None else recorder.wrap_reconcile(reconcile),
    )
    try:
        crashed = await _start(start, recorder, tool)
        key = recorder.keys[0]
        lease = lease_of(actions, tool)
        if clock is not None:
            clock.advance(lease + 1)
        else:
            await asyncio.sleep(lease + 0.25)
        result = await resume()
    finally:
        tools[tool] = original
    state = await actions.inspect(key)
    resumed = Resumed(
        key,
        Fault(fault),
        crashed,
        result,
        recorder.body_runs,
        recorder.reconciled,
        tuple(recorder.keys),
        state,
    )
    if check:
        _check(resumed, original.effects)
    return resumed


async def _start(start: Callable[[], Awaitable[Any]], recorder: _Recorder, tool: str) -> str:
    """Run ``start`` to the simulated death; what it raised, as text."""
    try:
        await start()
    except BaseException as exc:
        if _caused_by_crash(exc):
            return f"{type(exc).__name__}: {exc}"
        if not recorder.keys:
            raise AssertionError(
                f"start() raised before it called tool {tool!r} through the executor: {exc!r}"
            ) from exc
        raise
    if not recorder.keys:
        raise AssertionError(
            f"start() never called tool {tool!r} through the executor: the step runs its "
            "effect some other way (or the tool was not reached), so no crash could be injected"
        )
    raise AssertionError(
        f"start() returned although tool {tool!r} died at its first call: the runtime caught "
        "the simulated death and carried on in the same process, which a real crash never does"
    )


def _caused_by_crash(exc: BaseException) -> bool:
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, SimulatedCrash):
            return True
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
    return False


def _check(resumed: Resumed, effects: str) -> None:
    story = (
        f"{resumed.key}: died at {resumed.fault.value} ({resumed.crashed}); calls of the tool "
        f"and its reconcile by key: {list(resumed.keys)}"
    )
    if len(resumed.keys) < 2:
        raise AssertionError(
            f"the recovery never reached the action (the runtime recorded the step as done, or "
            f"resume() did not run it): {story}"
        )
    others = [k for k in resumed.keys if k != resumed.key]
    if others:
        raise AssertionError(
            f"the recovery asked for another action ({others[0]}) than the one that died: the "
            f"key changes when the runtime recovers, so the effect can happen twice: {story}"
        )
    if effects == "external" and resumed.body_runs > 1:
        raise AssertionError(
            f"the external tool's body ran to its effect {resumed.body_runs} times: {story}"
        )
    if resumed.state is None or resumed.state.state is State.IN_FLIGHT:
        raise AssertionError(f"the action is still in flight after the recovery: {story}")
