"""Prefect tasks whose external effects take effect once, even when the process dies after the
effect and before Prefect records the task's result.

Prefect skips a task on a retry of its flow run when the task's result is in its result cache
(``persist_result=True``, keyed by the task's cache key). A task that crashed after its effect
and before its result was persisted has no cached result, so the retried flow run runs it
again: a second refund. Run the effect through `Actions` instead:

    actions = Actions(store)
    prefect_actions = PrefectActions(actions)

    @actions.tool("refund", effects="external", reconcile=find_refund)
    async def refund(call: ToolCall, tx: Connection) -> dict[str, Any]:
        return await payments.refund(call.request, idempotency_key=call.downstream_key)

    @prefect_actions.task(persist_result=True, retries=3, retry_delay_seconds=1)
    async def refund_order(order: str, cents: int) -> dict[str, Any]:
        return (await prefect_actions.run("refund", {"order": order, "cents": cents})).value

    @flow
    async def settle(order: str) -> None:
        await refund_order(order, 2599)

**The key.** The scope is the flow run's id (behind ``tenant`` when one is given): a retry of
the flow run (``prefect flow-run retry``, the flow's ``retries=``, a worker picking up a
crashed run again) keeps it. The action id is the task's key (its name and ``task_key``) and
its cache key, the key Prefect itself looks the task's result up by (the default cache policy:
the task's inputs, its source and the flow run), with the call's ordinal among the task's calls
of the tool. So a task whose result Prefect cached is skipped by Prefect, one cut off after its
effect is reconciled by the executor (never called again), one that never started runs, and a
task retry (``retries=``) asks for the same action.

A task needs a cache key for this: one with ``cache_policy=NO_CACHE`` or
``persist_result=False`` (which turns Prefect's cache off) is refused. Keep values
that change on every run (timestamps, random ids) out of the task's inputs or its cache policy,
as Prefect's own cache requires.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prefect import task as prefect_task
from prefect.context import FlowRunContext, TaskRunContext
from prefect.transactions import get_transaction

from receiver import ActionError, ActionResult, Actions, ConfigurationError

__all__ = ["PrefectActions"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass
class _Task:
    """One attempt of one task run: where its actions are keyed and the ordinals handed out."""

    scope: str
    stem: str
    task_run_id: str
    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def next_id(self, tool: str) -> str:
        # Counted before any await: calls started together are numbered in the order they were
        # started, the same order on every attempt.
        self.counts[tool] += 1
        return f"{self.stem}.{self.counts[tool]}"


_CURRENT: contextvars.ContextVar[_Task | None] = contextvars.ContextVar(
    "receiver_prefect_task", default=None
)


class PrefectActions:
    """The executor's tools, run from Prefect tasks with keys a retried flow run reproduces.
    ``tenant``: a fixed scope above the flow run id."""

    def __init__(self, actions: Actions, *, tenant: str | None = None) -> None:
        if not isinstance(actions, Actions):
            raise ConfigurationError("PrefectActions needs a receiver.Actions executor")
        if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
            raise ConfigurationError("tenant must be a non-empty string")
        self.actions = actions
        self.tenant = tenant

    def task(self, **options: Any) -> Callable[[F], Any]:
        """``@prefect.task(**options)`` for an ``async def`` that calls `run`: each
        attempt of the task numbers its calls from one, so a retried task, or the task run
        again by a retried flow run, asks for the same actions in the same order. ``options``
        are Prefect's (``persist_result``, ``retries``, ``retry_delay_seconds``,
        ``cache_policy``, ``name``...); ``cache_policy=NO_CACHE`` and ``persist_result=False``
        leave the task no key."""

        def decorate(func: F) -> Any:
            if not inspect.iscoroutinefunction(func):
                raise ConfigurationError(
                    f"{getattr(func, '__name__', func)!r} must be an 'async def' task to run "
                    "tools through the executor"
                )

            @functools.wraps(func)
            async def numbered(*args: Any, **kwargs: Any) -> Any:
                token = _CURRENT.set(self._task())
                try:
                    return await func(*args, **kwargs)
                finally:
                    _CURRENT.reset(token)

            return prefect_task(**options)(numbered)

        return decorate

    async def run(self, tool: str, request: Mapping[str, Any], *, version: int = 1) -> ActionResult:
        """Run ``tool`` once for this task's next call of it; on every retry, the stored
        result. Raises what `Actions.execute` raises: ActionInProgress (a dead attempt's
        lease has not run out yet: give the task ``retries=``), ActionNeedsReview,
        ActionFailed, ActionConflict, or the tool's own exception (its claim released)."""
        current = _CURRENT.get()
        context = TaskRunContext.get()
        if current is None or context is None or str(context.task_run.id) != current.task_run_id:
            raise ActionError(
                "PrefectActions.run() must be called from a task decorated with "
                "@prefect_actions.task() (the task whose key keys the action)"
            )
        action = self.actions.propose(
            tool,
            scope=current.scope,
            action_id=current.next_id(tool),
            request=request,
            version=version,
        )
        return await self.actions.execute(action, turn=f"{current.scope}/{current.stem}")

    def _task(self) -> _Task:
        flow_run = FlowRunContext.get()
        context = TaskRunContext.get()
        if flow_run is None or flow_run.flow_run is None or context is None:
            raise ActionError(
                "not inside a Prefect task of a flow run: call the task from a @flow (the flow "
                "run's id and the task's key key its actions)"
            )
        transaction = get_transaction()
        cache_key = transaction.key if transaction is not None else None
        if not cache_key:
            raise ConfigurationError(
                f"task {context.task.name!r} has no cache key (cache_policy=NO_CACHE, or "
                "persist_result=False, which turns Prefect's cache off): PrefectActions keys "
                "its actions by the task's cache key; keep a cache policy (the default, "
                "INPUTS + TASK_SOURCE + RUN_ID, is right for most tasks)"
            )
        scope = _quote(str(flow_run.flow_run.id))
        if self.tenant is not None:
            scope = f"{_quote(self.tenant)}/{scope}"
        stem = f"{context.task.task_key}.{cache_key}"
        if len(stem) > 180:
            stem = f"{context.task.task_key[:60]}.h" + hashlib.sha256(stem.encode()).hexdigest()
        return _Task(scope, stem, str(context.task_run.id))


def _quote(part: str) -> str:
    # "/" separates tenant from flow run id: escaped inside each, so no two pairs join alike.
    return part.replace("%", "%25").replace("/", "%2F")
