"""LangGraph nodes and tasks whose tools take effect once per graph step, however often
LangGraph runs that step again: a resume after a crash or an ``interrupt()``, a retry policy,
the same turn sent again, a second invocation of the thread at the same time.

    graph_actions = GraphActions(actions, tenant=lambda runtime: runtime.context.tenant)

    builder.add_node("tools", graph_actions.tool_node(["refund_order", "send_email"]))

    @graph_actions.node
    async def settle(state: State) -> dict[str, Any]:
        refund = await graph_actions.run("refund_order", {"order_id": state["order"]})
        if interrupt({"refunded": refund.value}) != "close":   # re-runs settle on resume
            ...

**The key.** The scope is the graph's thread (``config["configurable"]["thread_id"]``), behind
the tenant when one is given. The action id is where LangGraph runs the call: the step number,
the node and its task path (which ``Send`` packet, which ``@task`` call of the entrypoint), and
the call's ordinal among this task's calls of the same tool (for `GraphActions.tool_node`:
among the message's calls of that tool). All of it is the same when LangGraph runs the task
again, in any durability mode: after a crash the step is numbered from the last saved
checkpoint, so the re-run lands on the same number.

Not used: the model's ``tool_call`` id, which a regenerated answer changes (it only pairs each
`ToolMessage` with its call), the arguments, which the model words anew, and LangGraph's
own task id, which is a hash over the id of the checkpoint the step started from: under the
default ``durability="async"`` (and ``"exit"``) that checkpoint may never have been saved when
the process died, the re-run starts from an older one, and every task id after it changes
(measured: a crash in the tools node, the turn sent again, same step, another task id). Inside a
subgraph the parent's step is not visible, so the parent part of the id is the parent task's id
there: use ``durability="sync"`` for subgraphs that run tools.

**What the graph sees.** A stored result, byte for byte, on every re-run. A final failure
(`ActionFailed`) is a tool error message to the model in `tool_node`,
as LangGraph's ``ToolNode`` answers a failed tool; `GraphActions.run` raises it.
`ActionNeedsReview` always raises and stops the graph: a person must look, and
the model must not be told "failed" about a tool that may have acted. So do
`ActionConflict` and `ActionInProgress`: shown to the model,
either would tempt it to ask again in a later step, under a new key: a second effect.
``RetryPolicy(retry_on=retry_on)`` on the node re-runs it (same key) while another attempt is
still running. A tool's own exception propagates (its claim released), as from ``ToolNode``.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime, get_runtime
from langgraph.types import RetryPolicy

from receiver import (
    Action,
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    ActionResult,
    Actions,
    ConfigurationError,
)

__all__ = ["GraphActions", "ToolNodeFunc", "retry_on"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
Tenant = str | Callable[[Runtime[Any]], str]


class ToolNodeFunc(Protocol):
    """What `GraphActions.tool_node` returns: a LangGraph node taking the state."""

    async def __call__(self, state: Any) -> dict[str, list[ToolMessage]]: ...


_LANGGRAPH_RETRY_ON = RetryPolicy().retry_on


def retry_on(exc: Exception) -> bool:
    """For ``RetryPolicy(retry_on=retry_on)``: retry `ActionInProgress` (the
    re-run waits for the first attempt's stored result) and what LangGraph retries by default;
    never a final answer (ActionFailed, ActionNeedsReview, ActionConflict), which a retry would
    only replay."""
    if isinstance(exc, ActionInProgress):
        return True
    if isinstance(exc, ActionError):
        return False
    default = _LANGGRAPH_RETRY_ON
    if callable(default) and not isinstance(default, type):
        return bool(default(exc))
    return False


@dataclass
class _Task:
    """One run of one LangGraph task: its key parts and the ordinals it has handed out."""

    scope: str
    stem: str
    namespace: str
    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def next_id(self, tool: str) -> str:
        # Counted before any await, so calls started together (asyncio.gather) are numbered
        # in the order they were started, the same order on every run.
        self.counts[tool] += 1
        return f"{self.stem}.{self.counts[tool]}"


_CURRENT: contextvars.ContextVar[_Task | None] = contextvars.ContextVar(
    "receiver_langgraph_task", default=None
)


class GraphActions:
    """The executor's tools, run from LangGraph nodes and tasks with keys LangGraph's re-runs
    reproduce. ``tenant``: a fixed scope above the thread, or a function of the run's
    `Runtime` (``runtime.context``, the server's authenticated user)."""

    def __init__(self, actions: Actions, *, tenant: Tenant | None = None) -> None:
        if not isinstance(actions, Actions):
            raise ConfigurationError("GraphActions needs a receiver.Actions executor")
        if tenant is not None and not callable(tenant) and not _nonempty(tenant):
            raise ConfigurationError("tenant must be a non-empty string or a function")
        self.actions = actions
        self.tenant = tenant

    # -- custom nodes and @task functions ------------------------------------------------------

    def node(self, func: F) -> F:
        """Decorate an ``async def`` node, ``@task`` or ``@entrypoint`` function that calls
        `run` (under ``@task``: ``@task`` on top). Each run of it numbers its calls from
        one, so a re-run of the task asks for the same actions in the same order."""
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError(
                f"{getattr(func, '__name__', func)!r} must be an 'async def' node or task "
                "to run tools through the executor"
            )

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = _CURRENT.set(self._task())
            try:
                return await func(*args, **kwargs)
            finally:
                _CURRENT.reset(token)

        return wrapper  # type: ignore[return-value]

    async def run(self, tool: str, request: Mapping[str, Any]) -> ActionResult:
        """Run ``tool`` once for this task's next call of it; on every re-run of the task,
        the stored result. Raises ActionFailed, ActionNeedsReview, ActionConflict,
        ActionInProgress or the tool's own exception (its claim released), each stopping the
        graph unless the node catches it."""
        task = _CURRENT.get()
        if task is None or task.namespace != _metadata().get("langgraph_checkpoint_ns"):
            raise ActionError(
                "GraphActions.run() must be called from a node or @task function decorated "
                "with @graph_actions.node (the task that numbers its calls)"
            )
        action = self.actions.propose(
            tool, scope=task.scope, action_id=task.next_id(tool), request=request
        )
        return await self.actions.execute(action, turn=f"{task.scope}/{task.stem}")

    # -- a ToolNode for chat models ------------------------------------------------------------

    def tool_node(self, tools: Iterable[str], *, messages_key: str = "messages") -> ToolNodeFunc:
        """A node that runs the tool calls of the last AI message through the executor, like
        LangGraph's ``ToolNode``: a `ToolMessage` per call, in the calls' order. A call
        of a tool not in ``tools``, or with arguments the ledger cannot keep, gets an error
        message and runs nothing. The n-th call of a
        tool in the message is that tool's action n of this step."""
        allowed = tuple(tools)
        if not allowed or not all(isinstance(name, str) for name in allowed):
            raise ConfigurationError("tool_node needs the names of the tools the model may call")
        for name in allowed:
            try:  # fails now, not at the first call, for a tool the executor does not have
                self.actions.propose(name, scope="check", action_id="check", request={})
            except ActionError as exc:
                raise ConfigurationError(f"tool_node: {exc}") from exc

        async def tools_node(state: Any) -> dict[str, list[ToolMessage]]:
            message = _last_ai_message(state, messages_key)
            task = self._task()
            calls = message.tool_calls
            # Every action is proposed (and a bad request answered) before any of them runs.
            proposed = [
                self._propose(task, call["name"], call["args"]) if call["name"] in allowed else None
                for call in calls
            ]
            turn = f"{task.scope}/{task.stem}"
            # Every call finishes before anything is raised: an external tool cut off mid-call
            # would be left for reconcile instead of completing.
            done = await asyncio.gather(
                *(self.actions.execute(a, turn=turn) for a in proposed if isinstance(a, Action)),
                return_exceptions=True,
            )
            outcomes = iter(done)
            replies: list[ToolMessage] = []
            raised: list[BaseException] = []
            for call, action in zip(calls, proposed, strict=True):
                call_id, name = call["id"] or "", call["name"]
                if action is None:
                    error = f"{name!r} is not a tool here; use one of {sorted(allowed)}"
                    replies.append(_error_reply(call_id, name, "unknown_tool", error))
                    continue
                if isinstance(action, str):
                    replies.append(_error_reply(call_id, name, "invalid_arguments", action))
                    continue
                outcome = next(outcomes)
                if isinstance(outcome, ActionResult):
                    replies.append(
                        ToolMessage(
                            content=outcome.body.decode(),
                            tool_call_id=call_id,
                            name=name,
                            artifact={"action_key": outcome.key, "replayed": outcome.replayed},
                        )
                    )
                elif isinstance(outcome, ActionFailed):
                    # Stored as final: the model sees the same failure on every re-run.
                    replies.append(_error_reply(call_id, name, "action_failed", str(outcome)))
                else:
                    raised.append(outcome)
            if raised:
                raise _first(raised)
            return {messages_key: replies}

        return tools_node

    def _propose(self, task: _Task, name: str, request: Any) -> Action | str:
        """The call's action, or why its arguments cannot be kept (NaN or an infinity, which
        ``json.loads`` reads from a model's output): the model's to correct, as a failed tool
        call is, with nothing claimed. What the model cannot correct (the thread's key parts)
        still stops the graph: the second ``propose`` raises it."""
        action_id = task.next_id(name)
        try:
            return self.actions.propose(
                name, scope=task.scope, action_id=action_id, request=request
            )
        except ActionError as exc:
            self.actions.propose(name, scope=task.scope, action_id=action_id, request={})
            return f"the arguments are invalid; nothing was done: {exc}"

    # -- the key -------------------------------------------------------------------------------

    def _task(self) -> _Task:
        """The running task's scope and id stem, from what LangGraph put in its config."""
        try:
            config = get_config()
        except RuntimeError as exc:
            raise ActionError(
                "not inside a LangGraph node or task: GraphActions keys tool calls by the "
                "graph's thread and step"
            ) from exc
        thread = config.get("configurable", {}).get("thread_id")
        if thread is None or not str(thread):
            raise ActionError(
                "the graph runs without a thread: compile it with a checkpointer and invoke it "
                "with config={'configurable': {'thread_id': ...}} (the thread scopes the keys)"
            )
        scope = _quote(str(thread))
        if self.tenant is not None:
            tenant = self.tenant if isinstance(self.tenant, str) else self.tenant(get_runtime())
            if not _nonempty(tenant):
                raise ActionError("the tenant function must return a non-empty string")
            scope = f"{_quote(tenant)}/{scope}"
        meta = _metadata()
        step, node = meta.get("langgraph_step"), meta.get("langgraph_node")
        path, namespace = meta.get("langgraph_path"), meta.get("langgraph_checkpoint_ns")
        if not isinstance(step, int) or not isinstance(namespace, str) or path is None:
            raise ActionError("LangGraph did not say which step and task this is")
        stem = f"{step}.{node}"
        if tuple(path) != ("__pregel_pull", node):  # a Send packet, an @task call
            stem = f"{stem}.{_path(path)}"
        # The namespace's last segments are this task and the @task calls that led to it
        # (already in the path); any before them are parent graphs, named by their task ids.
        parents = namespace.split("|")[: -(_depth(path) + 1)]
        if parents:
            names = ">".join(segment.partition(":")[0] for segment in parents)
            digest = hashlib.sha256("|".join(parents).encode()).hexdigest()[:16]
            stem = f"{names}@{digest}/{stem}"
        if len(stem) > 190:
            stem = "h" + hashlib.sha256(stem.encode()).hexdigest()[:40]
        return _Task(scope, stem, namespace)


def _metadata() -> Mapping[str, Any]:
    try:
        return get_config().get("metadata", {})
    except RuntimeError:
        return {}


def _path(path: Any) -> str:
    """LangGraph's task path as text: ``pull``/``push`` markers shortened, @task callers
    nested in parentheses, the trailing call/send flag left out."""
    if isinstance(path, tuple | list):
        parts = [p for p in path if not isinstance(p, bool)]
        return "(" + ",".join(_path(p) for p in parts) + ")"
    return str(path).removeprefix("__pregel_")


def _depth(path: Any) -> int:
    """How many @task callers the path nests (each is a namespace segment of its own)."""
    if isinstance(path, tuple | list) and len(path) > 1 and isinstance(path[1], tuple | list):
        return 1 + _depth(path[1])
    return 0


def _quote(part: str) -> str:
    # "/" separates tenant from thread: escaped inside each, so no two pairs join alike.
    return part.replace("%", "%25").replace("/", "%2F")


def _nonempty(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _last_ai_message(state: Any, key: str) -> AIMessage:
    messages: Sequence[AnyMessage] | None = (
        state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)
    )
    if not messages or not isinstance(messages[-1], AIMessage):
        raise ActionError(f"tool_node expects state[{key!r}] to end with an AI message")
    return messages[-1]


def _error_reply(call_id: str, name: str, error: str, detail: str) -> ToolMessage:
    content = orjson.dumps({"error": error, "detail": detail}).decode()
    return ToolMessage(content=content, tool_call_id=call_id, name=name, status="error")


def _first(raised: list[BaseException]) -> BaseException:
    """What stops the graph: needs-review first (never hidden behind another error), then a
    conflict, then the first other error."""
    for kind in (ActionNeedsReview, ActionConflict):
        for exc in raised:
            if isinstance(exc, kind):
                return exc
    return raised[0]
