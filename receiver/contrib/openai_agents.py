"""OpenAI Agents SDK tools whose calls take effect once: each call of an `action_tool` is
an action of `receiver.Actions`, keyed by the conversation turn and the call's ordinal in
it, never by the model's call id or its words.

    actions = Actions(store)

    @action_tool(actions, volatile=("reason",))
    async def refund_order(call: ToolCall, tx: Connection, order_id: str, amount_cents: int,
                           reason: str) -> dict[str, Any]:
        \"\"\"Refund an order.\"\"\"
        await tx.execute("INSERT INTO refunds ...", order_id, amount_cents)
        return {"refunded_cents": amount_cents}

    agent = Agent(name="support", tools=[refund_order])
    turn = AgentTurn(tenant="tenant-42", conversation="conv-7", turn="3")
    await Runner.run(agent, "Refund A-1001", context={TURN_KEY: turn})

**The key.** Scope: the turn's tenant. Action id: ``conversation/turn/n``, where ``n`` numbers
the tool's calls in one attempt of the turn, in the order the SDK runs them (a response's
order). The numbering lives in the `AgentTurn` inside the run's context, so the SDK saves
it with ``RunState.to_json()`` and ``from_json()`` brings it back exactly as saved: a run
restarted from its saved state numbers the calls it runs again as the first time, and each one
gets the stored result. A fresh attempt of the turn (a new ``AgentTurn`` with the same ids)
numbers a regenerated call as the one it replaces, whatever its new call id and wording. The
call id is only remembered, so that a call the SDK runs again is recognised; it is never part
of a key. A call that did not settle (the tool raised, another attempt still holds the action)
gives its number back: the model's retry takes it, so it cannot become a second action.

**What the model sees.** The stored result, on every call. ActionFailed, ActionInProgress and
the tool's own errors: a message from ``failure_error_function`` (as the SDK's own tools).
ActionNeedsReview and ActionConflict are never the model's to handle: `ActionStopped`
stops the run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
import urllib.parse
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Literal

from agents import AgentsException, FunctionTool, RunContextWrapper, Usage, UserError
from agents.function_schema import DocstringStyle, FuncSchema, function_schema
from agents.tool import ToolErrorFunction
from agents.tool_context import ToolContext
from pydantic import ValidationError

from receiver import (
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    Actions,
    ConfigurationError,
    Connection,
    ToolCall,
)

__all__ = [
    "TURN_KEY",
    "ActionStopped",
    "AgentTurn",
    "action_tool",
    "tool_error_message",
]

#: Where the run's context holds its :class:`AgentTurn`: this key of a mapping context, or
#: this attribute of any other context object.
TURN_KEY = "receiver_turn"

UserTool = Callable[..., Awaitable[Any]]
_MAX_IDS = 180  # percent-encoded conversation + turn: the action id stays within 200


class AgentTurn(dict[str, Any]):
    """One attempt of one conversation turn: the ids the key is built from (``tenant``,
    ``conversation``, ``turn``: the system's, never the model's) and the numbering of the
    attempt's tool calls. A dict of JSON values, so that ``RunState.to_json()`` saves it with
    the run as it saves any mapping. Build it with `start`; give each attempt of a turn
    its own, and resume an interrupted attempt only from the RunState that saved it."""

    # The live run this record numbers calls for (not an item: never serialized). A record
    # rebuilt from saved state has none until its first call.
    _owner: weakref.ref[Usage] | None = None

    @classmethod
    def start(cls, *, tenant: str, conversation: str, turn: str | int) -> AgentTurn:
        """A new attempt of ``turn`` in ``conversation``, for ``tenant`` (the key's scope)."""
        record = cls(tenant=tenant, conversation=conversation, turn=str(turn), calls={})
        record._check()
        return record

    @classmethod
    def restore(cls, saved: Mapping[str, Any]) -> AgentTurn:
        """The record as ``RunState.from_json()`` hands it back (a plain dict)."""
        if not isinstance(saved, Mapping):
            raise UserError(f"context[{TURN_KEY!r}] must be an AgentTurn, not {type(saved)}")
        try:
            record = cls(json.loads(json.dumps(saved)))  # a deep copy, of JSON values only
        except (TypeError, ValueError) as exc:
            raise UserError(f"context[{TURN_KEY!r}] is not a saved AgentTurn: {exc}") from exc
        record._check()
        return record

    @property
    def scope(self) -> str:
        return str(self["tenant"])

    @property
    def label(self) -> str:
        """``conversation/turn``: the executor's turn (its distinct-keys-per-turn metric)."""
        return "/".join(_quote(self[k]) for k in ("conversation", "turn"))

    def action_id(self, ordinal: int) -> str:
        return f"{self.label}/{ordinal}"

    def number(self, tool: str, call_id: str) -> int:
        """The ordinal of the call ``call_id`` of ``tool``: the one it already has if the SDK
        runs it again, else the lowest number a call gave back, else the next one. No await:
        the calls of one response are numbered in the order the SDK starts them."""
        slots = self["calls"].setdefault(tool, {"next": 0, "ids": {}, "open": []})
        ordinal = slots["ids"].get(call_id)
        if ordinal is None:
            if slots["open"]:
                ordinal = min(slots["open"])
            else:
                slots["next"] += 1
                ordinal = slots["next"]
            slots["ids"][call_id] = ordinal
        if ordinal in slots["open"]:
            slots["open"].remove(ordinal)
        return int(ordinal)

    def give_back(self, tool: str, ordinal: int) -> None:
        """The call numbered ``ordinal`` did not settle: the next new call of ``tool`` (the
        model's retry) takes its number, and so its action."""
        slots = self["calls"][tool]
        if ordinal not in slots["open"]:
            slots["open"].append(ordinal)

    def _check(self) -> None:
        for name in ("tenant", "conversation", "turn"):
            value = self.get(name)
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"AgentTurn {name} must be a non-empty string, not {value!r}")
        if len(self["tenant"]) > 200:
            raise UserError("AgentTurn tenant must have at most 200 characters")
        if len(self.label) > _MAX_IDS:
            raise UserError(f"AgentTurn conversation and turn must be short ids (<= {_MAX_IDS})")
        if not isinstance(self.get("calls"), dict):
            raise UserError("AgentTurn calls must be a dict (saved by a RunState)")

    def _bind(self, usage: Usage) -> None:
        """Tie the record to the run whose ``usage`` it sees first. A record another run
        numbered is refused: its numbers are ahead of any attempt that starts over, which would
        make a regenerated call a new action."""
        owner = None if self._owner is None else self._owner()
        if self._owner is None:
            self._owner = weakref.ref(usage)
        elif owner is not usage:
            raise UserError(
                "this AgentTurn was used by another run: start each attempt of a turn with a "
                "new AgentTurn.start(...), and resume an interrupted attempt from its saved "
                "RunState (without context_override); a nested agent run needs its own"
            )


class ActionStopped(AgentsException):
    """The run stopped at a tool call that a person or the application must look at:
    ``reason`` is ``"needs_review"`` (an external tool may have acted and nothing can say) or
    ``"conflict"`` (this call's action already ran with other arguments). The ledger keeps the
    outcome; the receiver's exception is the ``__cause__``."""

    def __init__(self, reason: Literal["needs_review", "conflict"], tool: str, key: str) -> None:
        self.reason, self.tool, self.key = reason, tool, key
        what = "needs review" if reason == "needs_review" else "conflicts with an earlier call"
        super().__init__(f"action {key} of tool {tool} {what}; the run was stopped")


def tool_error_message(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """The default ``failure_error_function``: what the model reads for each outcome."""
    if isinstance(error, ActionFailed):
        return f"The action failed and was not carried out: {error}"
    if isinstance(error, ActionInProgress):
        return (
            "Another attempt is still carrying out this action. Call the tool again with the "
            f"same arguments in about {max(1, round(error.retry_after))} s for its result."
        )
    if isinstance(error, _BadArguments):
        return f"The tool's arguments are invalid; nothing was done. {error}"
    return (
        f"The tool call did not complete ({type(error).__name__}: {error}). Calling it again "
        "with the same arguments is safe: the action takes effect at most once."
    )


class _BadArguments(Exception):
    """The model's arguments do not fit the tool's parameters."""


def action_tool(
    actions: Actions,
    *,
    effects: Literal["transactional", "external"] = "transactional",
    reconcile: Callable[[ToolCall], Awaitable[Any]] | None = None,
    volatile: Iterable[str] = (),
    lease: float | None = None,
    name_override: str | None = None,
    description_override: str | None = None,
    docstring_style: DocstringStyle | None = None,
    use_docstring_info: bool = True,
    failure_error_function: ToolErrorFunction | None = tool_error_message,
    strict_mode: bool = True,
    is_enabled: bool | Callable[[RunContextWrapper[Any], Any], Any] = True,
    needs_approval: bool
    | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]] = False,
) -> Callable[[UserTool], FunctionTool]:
    """Like the SDK's ``function_tool``, for ``async def tool(call, tx, <arguments>)``: the
    arguments after ``call`` (`ToolCall`) and ``tx`` (the ledger's
    transaction) are the model's, described to it from their types and the docstring. Registers
    the tool on ``actions`` (``effects``, ``reconcile``, ``volatile``, ``lease`` as
    `Actions.tool`) and returns the ``FunctionTool`` to give the agent.

    ``failure_error_function`` formats what the model reads when the action failed, is still
    in progress, or the tool raised (None: raise instead, as the SDK does). The other options
    are the SDK's."""

    def decorate(func: UserTool) -> FunctionTool:
        schema = _schema(
            func,
            name_override,
            description_override,
            docstring_style,
            use_docstring_info,
            strict_mode,
        )
        name = schema.name
        dropped = frozenset(volatile)
        unknown = {v.split(".")[0] for v in dropped} - set(schema.signature.parameters)
        if unknown:
            raise ConfigurationError(
                f"volatile names {sorted(unknown)} are not parameters of tool {name!r}"
            )
        model = schema.params_pydantic_model

        async def run(call: ToolCall, tx: Connection) -> Any:
            # From the stored request: the sweeper's recovery runs it with no SDK around.
            args, kwargs = schema.to_call_args(model.model_validate(dict(call.request)))
            return await func(call, tx, *args, **kwargs)

        actions.add_tool(
            name, run, effects=effects, reconcile=reconcile, volatile=dropped, lease=lease
        )

        async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
            turn = _turn_of(ctx)
            turn._bind(ctx.usage)
            try:
                request = model.model_validate(json.loads(arguments or "{}")).model_dump(
                    mode="json"
                )
            except (ValueError, ValidationError) as exc:
                # Nothing numbered, nothing stored: the corrected call is the same slot.
                return await _answer(ctx, _BadArguments(_describe(exc)))
            ordinal = turn.number(name, ctx.tool_call_id)
            try:
                action = actions.propose(
                    name, scope=turn.scope, action_id=turn.action_id(ordinal), request=request
                )
            except ActionError as exc:
                # Arguments that fit the schema but are no JSON the ledger keeps (an integer
                # past 64 bits): the model's to correct, not the run's end. The turn's ids were
                # checked when it started, so the request is what was refused.
                turn.give_back(name, ordinal)
                return await _answer(ctx, _BadArguments(str(exc)))
            try:
                result = await actions.execute(action, turn=turn.label)
            except ActionNeedsReview as exc:
                raise ActionStopped("needs_review", name, action.key) from exc
            except ActionConflict as exc:
                raise ActionStopped("conflict", name, action.key) from exc
            except ActionFailed as exc:  # final and stored: this number is spent
                return await _answer(ctx, exc)
            except (Exception, asyncio.CancelledError) as exc:
                turn.give_back(name, ordinal)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return await _answer(ctx, exc)
            return result.body.decode()

        async def _answer(ctx: ToolContext[Any], error: Exception) -> Any:
            if failure_error_function is None:
                raise error
            message = failure_error_function(ctx, error)
            return await message if inspect.isawaitable(message) else message

        return FunctionTool(
            name=name,
            description=schema.description or "",
            params_json_schema=schema.params_json_schema,
            on_invoke_tool=invoke,
            strict_json_schema=strict_mode,
            is_enabled=is_enabled,
            needs_approval=needs_approval,
        )

    return decorate


def _schema(
    func: UserTool,
    name: str | None,
    description: str | None,
    style: DocstringStyle | None,
    use_docstring: bool,
    strict: bool,
) -> FuncSchema:
    """The SDK's schema of ``func``'s model-facing parameters: all but ``call`` and ``tx``."""
    if not inspect.iscoroutinefunction(func):
        raise ConfigurationError(f"action_tool {func!r} must be an 'async def'")
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    if len(params) < 2 or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params[:2]
    ):
        raise ConfigurationError(
            f"action_tool {func.__name__!r} must take (call, tx, <the model's arguments>)"
        )
    hints = typing.get_type_hints(func, include_extras=True)
    facing = params[2:]

    async def shim(*args: Any, **kwargs: Any) -> Any:  # only read, never called
        raise NotImplementedError

    shim.__name__, shim.__qualname__ = func.__name__, func.__qualname__
    shim.__doc__, shim.__module__ = func.__doc__, func.__module__
    shim.__annotations__ = {k: v for k, v in hints.items() if k in {p.name for p in facing}}
    shim.__signature__ = signature.replace(parameters=facing)  # type: ignore[attr-defined]
    return function_schema(
        shim,
        docstring_style=style,
        name_override=name,
        description_override=description,
        use_docstring_info=use_docstring,
        strict_json_schema=strict,
    )


def _turn_of(ctx: ToolContext[Any]) -> AgentTurn:
    """The run's AgentTurn; a record RunState.from_json() rebuilt is made one again, in place."""
    context = ctx.context
    if isinstance(context, Mapping):
        found = context.get(TURN_KEY)
    else:
        found = getattr(context, TURN_KEY, None)
    if isinstance(found, AgentTurn):
        return found
    if found is None:
        raise UserError(
            f"tool {ctx.tool_name!r} runs through the receiver's executor and needs the turn: "
            f"Runner.run(..., context={{{TURN_KEY!r}: AgentTurn.start(tenant=..., "
            "conversation=..., turn=...)}) (or a context object with that attribute)"
        )
    record = AgentTurn.restore(found)
    if isinstance(context, MutableMapping):
        context[TURN_KEY] = record
    elif isinstance(context, Mapping):
        raise UserError(f"the run's context must be a mutable mapping to hold {TURN_KEY!r}")
    else:
        setattr(context, TURN_KEY, record)
    return record


def _quote(value: object) -> str:
    return urllib.parse.quote(str(value), safe="")


def _describe(exc: Exception) -> str:
    """Which arguments are wrong and why, without echoing their values."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
    return "the arguments are not a JSON object"
