"""Drive a user's own tools through their :class:`~receiver.Actions` as planners do: retries,
concurrent twins through one barrier, regenerations that reword the model's prose, a restart
from persisted state, and a process dying inside a tool, then recovered.

A :class:`Planner` executes and records what each attempt got (:class:`Attempt`); it never
raises the executor's answers (in progress, conflict, failed, needs review), so that a test
asserts on them. Faults are injected in-process, as the webhook kit's are: the registered tools
are wrapped (:class:`ToolFaults`), the user's code is untouched, and a "death" is
:class:`~receiver.testing.SimulatedCrash`, which nothing in the executor catches: the
transaction rolls back and the claim stays in flight until its lease runs out, as after a
SIGKILL.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .. import (
    Action,
    ActionConflict,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    Actions,
    ConfigurationError,
    Connection,
    State,
    Tool,
    ToolCall,
)
from ._assertions import _table
from ._clock import FakeClock
from ._faults import ArmedFaults, Fault, InjectedFailure, SimulatedCrash

# Attempts of each action key running in this process, over every planner: a key in flight
# that none of them runs is held by a dead attempt (see Planner._patience).
_RUNNING: collections.Counter[str] = collections.Counter()


@dataclass(frozen=True, slots=True)
class Attempt:
    """One execution of an action as its planner saw it. ``outcome`` is ``executed`` (the tool
    ran to a stored result), ``replayed``, ``in_flight`` (ActionInProgress), ``failed`` (the
    tool raised: its claim was released, a retry runs it again), ``action_failed`` (a final
    failure, stored), ``needs_review``, ``conflict`` (ActionConflict) or ``died``. ``body`` is
    the stored result's bytes (executed or replayed); ``error`` says what was raised otherwise.
    """

    key: str
    planner: int
    outcome: str
    body: bytes | None = None
    error: str = ""

    @property
    def replayed(self) -> bool:
        return self.outcome == "replayed"

    @property
    def answer(self) -> bytes | None:
        """What a replay must repeat byte for byte: the stored result."""
        return self.body

    @property
    def value(self) -> Any:
        return None if self.body is None else orjson.loads(self.body)

    def __repr__(self) -> str:
        shown = self.error if self.body is None else repr(_short(self.body))
        return f"<{self.key} by planner {self.planner}: {' '.join([self.outcome, shown]).strip()}>"


def _short(body: bytes) -> bytes:
    return body if len(body) <= 80 else body[:77] + b"..."


def _describe(exc: BaseException) -> str:
    text = str(exc)
    text = text if len(text) <= 100 else text[:97] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def tools_of(actions: Actions) -> dict[str, Tool]:
    """The tools registered on ``actions``, by name (the executor's own table, which the faults
    wrap in place)."""
    tools = getattr(actions, "_tools", None)
    if not isinstance(tools, dict):
        raise ConfigurationError(
            "receiver.testing cannot find the executor's tools: this receiver.testing does not "
            "match this receiver (install them together)"
        )
    return tools


def lease_of(actions: Actions, tool: str) -> float:
    """How long an attempt of ``tool`` holds its key."""
    return tools_of(actions)[tool].lease or actions.lease


class ToolFaults(ArmedFaults):
    """The faults armed on one executor, per action key. Install once per executor.

    `Fault.AFTER_CLAIM` strikes before the tool runs; ``BEFORE_COMMIT`` and
    ``AFTER_EXTERNAL_CALL`` after it returned (its ``tx`` writes made, its outside call done),
    before its result is stored: the names say what that point means for each kind of tool;
    ``HANDLER_ERROR`` makes the tool raise after its work (a timeout reading the answer of a
    call that went through).
    """

    def __init__(self, actions: Actions) -> None:
        super().__init__()
        tools = tools_of(actions)
        for name, tool in list(tools.items()):
            tools[name] = dataclasses.replace(tool, func=self._wrap(tool))

    @classmethod
    def of(cls, actions: Actions) -> ToolFaults:
        """The faults of ``actions``, installed on first use."""
        found = getattr(actions, "_testing_faults", None)
        if isinstance(found, ToolFaults):
            return found
        faults = cls(actions)
        actions._testing_faults = faults  # type: ignore[attr-defined]
        return faults

    def _wrap(self, tool: Tool) -> Any:
        func = tool.func

        async def with_faults(call: ToolCall, tx: Connection) -> Any:
            fault = self._take(call.action.key)
            if fault is Fault.AFTER_CLAIM:
                raise SimulatedCrash(f"{call.action.key}: died after the claim")
            result = await func(call, tx)
            if fault is Fault.HANDLER_ERROR:
                raise InjectedFailure(f"{call.action.key}: the tool failed after its work")
            if fault is not None:
                raise SimulatedCrash(f"{call.action.key}: died {fault.value.replace('_', ' ')}")
            return result

        with_faults.__qualname__ = getattr(func, "__qualname__", tool.name)
        return with_faults


def reword(action: Action, fields: Sequence[str], n: int) -> dict[str, Any]:
    """``action``'s request as a model regenerating the call words it: each of ``fields`` (names,
    or dotted paths such as ``"meta.at"``) takes a new value, ``n`` telling the wordings apart;
    everything else is kept."""
    request: dict[str, Any] = orjson.loads(orjson.dumps(action.request))
    for field in fields:
        *parents, last = field.split(".")
        node: Any = request
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        old = node.get(last)
        if isinstance(old, str):
            node[last] = f"Regenerated ({n}): {old}"
        elif isinstance(old, int | float) and not isinstance(old, bool):
            node[last] = old + n
        else:
            node[last] = f"regenerated {n}"
    return request


class Planner:
    """Executes a user's actions as an agent's planner would, recording each `Attempt`.

    ``actions`` is the user's executor (tools registered). ``scope`` is the tenant or
    conversation `propose` puts in every key. ``number`` names this planner in the
    attempts (a second process, a restarted one). The faults of ``actions`` are installed on
    first use (`ToolFaults`).

    The kit runs on a fake clock: a duplicate whose key is held by a dead attempt can only end
    in "in progress" until the test moves the clock, so it is not made to wait ``actions.wait``
    seconds of real time for that answer (see `execute`).
    """

    def __init__(self, actions: Actions, *, scope: str = "tenant-1", number: int = 1) -> None:
        self.actions = actions
        self.scope = scope
        self.number = number
        self.faults = ToolFaults.of(actions)
        self._rewordings = 0

    def propose(self, tool: str, action_id: str, request: Mapping[str, Any]) -> Action:
        """The action ``action_id`` (assigned by the system, never by the model) of ``tool``."""
        return self.actions.propose(tool, scope=self.scope, action_id=action_id, request=request)

    def restore(self, action: Action) -> Action:
        """``action`` proposed again by this planner from what a planner persists (scope, tool,
        action id, request as JSON): what a restarted planner does."""
        request = orjson.loads(orjson.dumps(action.request))
        return self.actions.propose(
            action.tool,
            scope=action.scope,
            action_id=action.action_id,
            request=request,
            version=action.version,
        )

    def regenerate(self, action: Action, fields: Sequence[str] | None = None) -> Action:
        """``action`` as the model proposes it again after regenerating its answer: the same
        tool and system-assigned action id, ``fields`` reworded (by default the tool's
        ``volatile`` fields: what the model words freely)."""
        if fields is None:
            fields = sorted(tools_of(self.actions)[action.tool].volatile)
        self._rewordings += 1
        request = reword(action, fields, self._rewordings)
        return self.actions.propose(
            action.tool,
            scope=action.scope,
            action_id=action.action_id,
            request=request,
            version=action.version,
        )

    def lease(self, action: Action) -> float:
        """How long an attempt of ``action`` holds its key: move the clock past it to let the
        retry, the sweeper or reconcile recover a dead attempt."""
        return lease_of(self.actions, action.tool)

    async def execute(
        self, action: Action, *, fault: Fault | None = None, turn: str | None = None
    ) -> Attempt:
        """Execute ``action`` once; ``fault`` strikes this attempt if it runs the tool. A key
        held by a dead attempt (in flight, and no attempt of it running in this process) is
        answered "in progress" at once, as it would be after the executor's ``wait``."""
        with _waiting(await self._patience(action), [self.actions]):
            return await self._execute(action, fault, turn)

    async def twins(self, action: Action, copies: int = 10) -> list[Attempt]:
        """``copies`` concurrent executions of ``action`` on this planner, released together
        through one barrier."""
        return await concurrently([self] * copies, action)

    async def _patience(self, action: Action) -> bool:
        """Whether a duplicate may wait ``actions.wait`` for the attempt that holds the key:
        not when that attempt is dead (nothing on a fake clock can end it during the wait)."""
        if self.actions.wait == 0 or _RUNNING[action.key]:
            return True
        state = await self.actions.inspect(action)
        if state is None or state.state is not State.IN_FLIGHT:
            return True
        now = self.actions.store.now()
        return state.lease_until <= (time.time() if now is None else now)

    async def _execute(self, action: Action, fault: Fault | None, turn: str | None) -> Attempt:
        if fault is not None:
            self.faults.arm(action.key, fault)
        _RUNNING[action.key] += 1
        try:
            result = await self.actions.execute(action, turn=turn)
        except SimulatedCrash as exc:
            where = str(exc).removeprefix(f"{action.key}: ").removeprefix("died ")
            return self._attempt(action, "died", error=f"({where})")
        except ActionConflict:
            return self._attempt(action, "conflict", error="(another request, one key)")
        except ActionInProgress as exc:
            return self._attempt(action, "in_flight", error=f"(retry after {exc.retry_after:g} s)")
        except ActionNeedsReview as exc:
            return self._attempt(action, "needs_review", error=_describe(exc))
        except ActionFailed as exc:
            return self._attempt(action, "action_failed", error=_describe(exc))
        except InjectedFailure as exc:
            what = str(exc).removeprefix(f"{action.key}: ")
            return self._attempt(action, "failed", error=f"({what})")
        except Exception as exc:
            # The tool raised: its claim was released, and the next attempt runs it again.
            return self._attempt(action, "failed", error=_describe(exc))
        finally:
            _RUNNING[action.key] -= 1
            if fault is not None:
                self.faults.disarm()  # a fault belongs to this attempt only
        outcome = "replayed" if result.replayed else "executed"
        return self._attempt(action, outcome, body=result.body)

    def _attempt(self, action: Action, outcome: str, **details: Any) -> Attempt:
        return Attempt(action.key, self.number, outcome, **details)

    def __repr__(self) -> str:
        return f"Planner({self.number}, scope={self.scope!r}, {self.actions!r})"


@contextlib.contextmanager
def _waiting(patient: bool, executors: Sequence[Actions]) -> Iterator[None]:
    """The executors' ``wait`` as configured, or 0 while a dead attempt holds the key: the
    answer is "in progress" either way, and a wait would only cost real time."""
    saved = [(a, a.wait) for a in executors]
    if not patient:
        for actions, _ in saved:
            actions.wait = 0.0
    try:
        yield
    finally:
        for actions, wait in saved:
            actions.wait = wait


async def concurrently(planners: Sequence[Planner], action: Action) -> list[Attempt]:
    """One execution of ``action`` by each of ``planners`` (the same planner several times:
    twins in one process; several: concurrent planner processes), released together through
    one barrier. Each planner proposes it from the persisted action, as it would."""
    if not planners:
        raise ConfigurationError("a concurrent execution needs at least one planner")
    # Decided once for the batch: a twin that started first must not make the others think
    # the key's holder is alive (it is) or dead (it is not).
    patient = await planners[0]._patience(action)
    barrier = asyncio.Barrier(len(planners))
    first = planners[0].actions
    proposed = [action if p.actions is first else p.restore(action) for p in planners]

    async def one(planner: Planner, mine: Action) -> Attempt:
        await barrier.wait()
        return await planner._execute(mine, None, None)

    executors = list({id(p.actions): p.actions for p in planners}.values())
    with _waiting(patient, executors):
        attempts = await asyncio.gather(
            *(one(p, a) for p, a in zip(planners, proposed, strict=True))
        )
    return list(attempts)


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a crash and its recovery looked like: the dying attempt, a retry within the lease,
    the recovery (a retry or the sweeper, then a retry) and a last retry."""

    action: Action
    fault: Fault
    attempts: tuple[Attempt, ...]
    swept: str | None = None

    @property
    def executions(self) -> int:
        return sum(a.outcome == "executed" for a in self.attempts)


async def crash_and_recover(
    planner: Planner,
    action: Action,
    clock: FakeClock,
    *,
    fault: Fault = Fault.AFTER_EXTERNAL_CALL,
    recover: str = "retry",
    check: bool = True,
) -> Recovery:
    """Kill ``action``'s first attempt at ``fault``, retry within its lease (still in
    progress), let the lease run out and recover as production does: ``recover="retry"`` (the
    planner's retry reconciles or re-runs it) or ``"sweep"`` (a sweeper pass does, and the
    retry replays its answer); then retry once more.

    With ``check`` (the default), raises AssertionError unless the tool ran to a stored result
    at most once, every replay repeated it byte for byte and the key ended out of flight (a
    stored result, a final failure, or marked for review). Your own count query says whether
    the effect happened once.
    """
    if recover not in ("retry", "sweep"):
        raise ConfigurationError(f"recover must be 'retry' or 'sweep', not {recover!r}")
    attempts = [await planner.execute(action, fault=fault)]
    attempts.append(await planner.execute(action))
    clock.advance(planner.lease(action) + 1)
    swept = None
    if recover == "sweep":
        report = await planner.actions.sweep()
        swept = f"recovered {report.recovered}"
    attempts.append(await planner.execute(action))
    attempts.append(await planner.execute(action))
    recovery = Recovery(action, Fault(fault), tuple(attempts), swept)
    if check:
        check_attempts(action.key, attempts)
        state = await planner.actions.inspect(action)
        if state is not None and state.state is State.IN_FLIGHT:
            raise AssertionError(
                f"{action.key}: still in flight after the recovery:\n{_table(attempts)}"
            )
    return recovery


def check_attempts(key: str, attempts: Sequence[Attempt]) -> None:
    """What holds for any tool: it ran to a stored result at most once, every replay repeats
    that result byte for byte, and no proposal of the same action was refused as another."""
    executed = [a for a in attempts if a.outcome == "executed"]
    if len(executed) > 1:
        raise AssertionError(
            f"{key}: the tool ran to a stored result {len(executed)} times:\n" + _table(attempts)
        )
    results = {a.body for a in attempts if a.outcome in ("executed", "replayed")}
    if len(results) > 1:
        raise AssertionError(f"{key}: the replays are not byte-identical:\n" + _table(attempts))
    if any(a.outcome == "conflict" for a in attempts):
        raise AssertionError(
            f"{key}: the same action, proposed again, was refused as another (ActionConflict): "
            "every field the model words anew must be volatile= on the tool:\n" + _table(attempts)
        )
