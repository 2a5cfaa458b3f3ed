"""DBOS steps whose external effects take effect once, even when the process dies after the
effect and before DBOS records the step.

DBOS checkpoints a step's output when the step returns; a workflow recovered after a crash
skips the steps it recorded and runs the others again. A step that crashed after its effect
(a refund, an email) and before its output was recorded therefore acts twice: DBOS documents
steps as at-least-once. Run the effect through `Actions` instead:

    actions = Actions(store)
    dbos_actions = DBOSActions(actions)

    @actions.tool("refund", effects="external", reconcile=find_refund)
    async def refund(call: ToolCall, tx: Connection) -> dict[str, Any]:
        return await payments.refund(call.request, idempotency_key=call.downstream_key)

    @dbos_actions.step()
    async def refund_order(order: str, cents: int) -> dict[str, Any]:
        return (await dbos_actions.run("refund", {"order": order, "cents": cents})).value

    @DBOS.workflow()
    async def settle(order: str) -> None:
        await refund_order(order, 2599)

**The key.** The scope is the workflow id (behind ``tenant`` when one is given); the action id
is the step's position in the workflow (``DBOS.step_id``, the number DBOS itself records the
step under) and the call's ordinal among this step's calls of the tool. DBOS gives a step the
same id when it retries it and when a recovered workflow reaches it again, so every attempt
asks for the same action: the first one that finished is replayed, one that was cut off after
its effect is reconciled (never called again), one that never started runs. Nothing that
changes on recovery (a timestamp, DBOS's executor id, the attempt number) is part of the key.

Start workflows under an id of your own (``SetWorkflowID(order_id)``) when the same business
action must not run twice across workflows: the key is only as stable as the workflow id.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dbos import DBOS

from receiver import ActionError, ActionResult, Actions, ConfigurationError

__all__ = ["DBOSActions"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass
class _Step:
    """One attempt of one step: where its actions are keyed and the ordinals handed out."""

    scope: str
    step_id: int
    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def next_id(self, tool: str) -> str:
        # Counted before any await: calls started together are numbered in the order they were
        # started, the same order on every attempt.
        self.counts[tool] += 1
        return f"step-{self.step_id}.{self.counts[tool]}"


_CURRENT: contextvars.ContextVar[_Step | None] = contextvars.ContextVar(
    "receiver_dbos_step", default=None
)


class DBOSActions:
    """The executor's tools, run from DBOS steps with keys a recovered workflow reproduces.
    ``tenant``: a fixed scope above the workflow id (workflow ids are unique per DBOS
    application, not across applications sharing one ledger)."""

    def __init__(self, actions: Actions, *, tenant: str | None = None) -> None:
        if not isinstance(actions, Actions):
            raise ConfigurationError("DBOSActions needs a receiver.Actions executor")
        if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
            raise ConfigurationError("tenant must be a non-empty string")
        self.actions = actions
        self.tenant = tenant

    def step(self, **options: Any) -> Callable[[F], F]:
        """``@DBOS.step(**options)`` for an ``async def`` that calls `run`: each attempt
        of the step numbers its calls from one, so a retried or recovered step asks for the
        same actions in the same order. ``options`` are DBOS's (``retries_allowed``,
        ``max_attempts``, ``interval_seconds``, ``backoff_rate``, ``name``)."""

        def decorate(func: F) -> F:
            if not inspect.iscoroutinefunction(func):
                raise ConfigurationError(
                    f"{getattr(func, '__name__', func)!r} must be an 'async def' step to run "
                    "tools through the executor"
                )

            @functools.wraps(func)
            async def numbered(*args: Any, **kwargs: Any) -> Any:
                token = _CURRENT.set(self._step())
                try:
                    return await func(*args, **kwargs)
                finally:
                    _CURRENT.reset(token)

            return DBOS.step(**options)(numbered)  # type: ignore[return-value]

        return decorate

    async def run(self, tool: str, request: Mapping[str, Any], *, version: int = 1) -> ActionResult:
        """Run ``tool`` once for this step's next call of it; on every retry and recovery of
        the step, the stored result. Raises what `Actions.execute` raises:
        ActionInProgress (a dead attempt's lease has not run out yet: let DBOS retry the step,
        ``retries_allowed=True``), ActionNeedsReview, ActionFailed, ActionConflict, or the
        tool's own exception (its claim released)."""
        step = _CURRENT.get()
        if step is None or DBOS.step_id != step.step_id:
            raise ActionError(
                "DBOSActions.run() must be called from a step decorated with "
                "@dbos_actions.step() (the step whose position keys the action)"
            )
        action = self.actions.propose(
            tool,
            scope=step.scope,
            action_id=step.next_id(tool),
            request=request,
            version=version,
        )
        return await self.actions.execute(action, turn=f"{step.scope}/step-{step.step_id}")

    def _step(self) -> _Step:
        workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
        if workflow_id is None or step_id is None:
            raise ActionError(
                "not inside a DBOS step of a workflow: call the step from a @DBOS.workflow "
                "(the workflow id and the step's position key its actions)"
            )
        scope = _quote(workflow_id)
        if self.tenant is not None:
            scope = f"{_quote(self.tenant)}/{scope}"
        return _Step(scope, step_id)


def _quote(part: str) -> str:
    # "/" separates tenant from workflow id: escaped inside each, so no two pairs join alike.
    return part.replace("%", "%25").replace("/", "%2F")
