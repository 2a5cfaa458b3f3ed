"""Pydantic AI tools that take effect once: every call runs through `receiver.Actions`,
keyed by the turn the system named and the call's place in it, never by the model's words.

    actions = Actions(store)
    tools = ActionTools(actions)                   # deps are a Turn (or have a .turn)

    @tools.tool(volatile=("reason",))
    async def refund_order(call: ToolCall, tx: Connection, order_id: str, amount_cents: int,
                           reason: str = "") -> dict[str, Any]:
        await tx.execute("INSERT INTO refunds ...", order_id, amount_cents, call.action.key)
        return {"refunded_cents": amount_cents}

    agent = Agent(model, deps_type=Turn, toolsets=[tools.toolset])
    await agent.run(prompt, deps=Turn(scope="tenant-42/conv-7", turn=3), message_history=saved)

**The key.** ``scope`` and ``turn`` come from the run's deps: the application names the
conversation turn (its own counter, stored with the conversation) before the run starts. The
action id is that turn and the call's ordinal among this tool's calls in the turn: a
regenerated answer (another ``tool_call_id``, other wording), a run started again from its
message history, or the same turn run twice at once all land on the same keys, so the tool
runs once and every later call gets the stored result. The model's ``tool_call_id`` is never
used: it is new each time the model answers. Nor is argument text: rewording a volatile field
must not make a new action, and a regenerated call that changed a field that matters must be
refused (`ActionConflict`), not executed a second time.

The ordinal is read from the message history, which is the agent's saved state: each answer
the executor gave carries its turn and ordinal in ``ToolReturnPart.metadata`` (never sent to
the model). A call takes the first ordinal of the turn that no answered call holds, after those
of the earlier calls of the same tool in the same model response (counted only when their
arguments are valid: a call Pydantic AI rejects before it runs takes no ordinal). So a call
the model makes again after a retry prompt (``ModelRetry``, a validation error) takes the
ordinal it was given before, and a call after an executed one takes the next.

**Durable agents.** Inside a DBOS workflow (Pydantic AI's ``DBOSDurability``) or a Prefect
flow (``PrefectDurability``), key by the durable run instead of a Turn in the deps:
``ActionTools(actions, durable_scope="tenant-42")`` (or a function of the deps). The turn is
then the run's id, which those runtimes derive from the workflow id (the flow run id) and the
run's position in it, so a recovered workflow replays its recorded model responses into the
same keys: a tool call cut off after its effect is reconciled instead of run again. Outside a
durable run, or run by an agent without that runtime's capability (a plain ``Agent`` or the
deprecated ``DBOSAgent``/``PrefectAgent`` wrappers, whose run ids are random), such a toolset
refuses to act (``ActionError``). Under ``PrefectDurability`` give the toolset an ``id=``.

**What the model sees.** A result (stored on first run, the same on every retry) as a
``ToolReturn`` with the key in its metadata; `ActionFailed` as a final error
result it can act on (the corrected call is a new action); `ActionInProgress`
as ``ModelRetry`` (the call is made again with the same ordinal and gets the first attempt's
result, within the tool's ``retries``). Never shown to the model, and raised from the run:
`ActionNeedsReview` (a person must look) and `ActionConflict`
(the turn's call at this place already did something else).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

from pydantic_ai import (
    FunctionToolset,
    ModelRequest,
    ModelResponse,
    ModelRetry,
    RunContext,
    Tool,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
)
from pydantic_ai.messages import ModelMessage
from pydantic_ai.tools import ArgsValidatorFunc
from pydantic_core import SchemaValidator, to_jsonable_python

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

__all__ = ["METADATA_KEY", "ActionTools", "Turn"]

DepsT = TypeVar("DepsT")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
Effects = Literal["transactional", "external"]

#: The key of this module's entry in ``ToolReturnPart.metadata``: scope, turn, tool, ordinal,
#: action key (and ``replayed`` or ``failed``).
METADATA_KEY = "receiver"

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True, slots=True)
class Turn:
    """Where a run's actions are keyed, set by the application for each user turn: ``scope``
    (the tenant and conversation, or the authenticated principal) and ``turn`` (the
    conversation turn this run answers: the application's own counter, kept with the
    conversation, the same when the turn is regenerated or run again)."""

    scope: str
    turn: str | int

    def __post_init__(self) -> None:
        if not isinstance(self.scope, str) or not self.scope.strip():
            raise ActionError("Turn.scope must be a non-empty string (tenant and conversation)")
        turn = self.turn
        if isinstance(turn, bool) or not (
            (isinstance(turn, str) and turn.strip()) or (isinstance(turn, int) and turn >= 0)
        ):
            raise ActionError(
                f"Turn.turn must be a non-empty string or an integer >= 0, not {turn!r}"
            )


class ActionTools(Generic[DepsT]):
    """Tools whose calls go through ``actions``, collected in `toolset` (pass it to
    ``Agent(toolsets=[...])``). ``turn`` reads the `Turn` from the run's deps; by
    default the deps are a Turn or have a ``turn`` attribute that is one. ``durable_scope``
    (a string, or a function of the deps) keys by the durable run instead: that scope, and the
    run's id as the turn (module docstring, "Durable agents"). ``id`` is the toolset's id,
    which ``PrefectDurability`` requires (it names the tools' tasks).

    A tool is ``async def f(call: ToolCall, tx: Connection, <arguments>)``: the model sees the
    arguments after ``call`` and ``tx``, Pydantic AI validates them, and the executor runs the
    function once per action with the validated arguments (again from the stored request when
    the sweeper recovers a stale transactional claim, which is why the body gets no
    ``RunContext``: keep clients in closures, as with any executor tool).
    """

    def __init__(
        self,
        actions: Actions,
        *,
        turn: Callable[[DepsT], Turn] | None = None,
        durable_scope: str | Callable[[DepsT], str] | None = None,
        retries: int | None = None,
        id: str | None = None,
    ) -> None:
        if turn is not None and durable_scope is not None:
            raise ConfigurationError(
                "pass turn= or durable_scope=, not both: a durable run keys its actions by "
                "the run itself"
            )
        if isinstance(durable_scope, str) and not durable_scope.strip():
            raise ConfigurationError("durable_scope must be a non-empty string or a function")
        self.actions = actions
        self.toolset: FunctionToolset[DepsT] = FunctionToolset(id=id)
        self._turn = turn
        self._durable_scope = durable_scope
        self._retries = retries

    def add(
        self,
        func: Callable[..., Awaitable[Any]],
        *,
        name: str | None = None,
        description: str | None = None,
        effects: Effects = "transactional",
        reconcile: Callable[[ToolCall], Awaitable[Any]] | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
        retries: int | None = None,
        args_validator: ArgsValidatorFunc[DepsT, ...] | None = None,
    ) -> Tool[DepsT]:
        """Register ``func`` as the executor tool ``name`` and as an agent tool of the same
        name. ``effects``, ``reconcile``, ``volatile`` and ``lease`` are
        `Actions.add_tool`'s. ``retries`` bounds Pydantic AI's retry prompts for this
        tool (an action still in progress elsewhere is one). Ask the model to correct its
        arguments from ``args_validator`` (it runs before the action is proposed), not from
        the body: a ``ModelRetry`` raised there releases the claim, and a corrected call with
        other arguments would then conflict with the released one."""
        name = name or str(getattr(func, "__name__", ""))
        call_param, tx_param, params = _split_signature(func, name)
        schema: SchemaValidator | None = None

        async def through_executor(ctx: RunContext[DepsT], /, **arguments: Any) -> ToolReturn:
            assert schema is not None  # set below, before the tool can be called
            return await self._call(ctx, name, schema, arguments)

        functools.update_wrapper(through_executor, func)
        # What Pydantic AI reads to build the schema the model sees: the arguments after
        # (call, tx), with the function's own annotations and docstring.
        through_executor.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY), *params],
            return_annotation=inspect.signature(func).return_annotation,
        )
        through_executor.__annotations__ = {
            k: v for k, v in func.__annotations__.items() if k not in (call_param, tx_param)
        }
        agent_tool: Tool[DepsT] = Tool(
            through_executor,
            takes_ctx=True,
            name=name,
            description=description,
            max_retries=retries if retries is not None else self._retries,
            args_validator=args_validator,
        )
        function_schema = agent_tool.function_schema
        schema = function_schema.validator

        async def run(call: ToolCall, tx: Connection) -> Any:
            # The stored request, validated again: the arguments the live call had, and the
            # same ones when the sweeper runs a stale transactional claim again.
            return await func(call, tx, **function_schema.revalidate(dict(call.request)))

        self.actions.add_tool(
            name,
            run,
            effects=effects,
            reconcile=reconcile,
            volatile=volatile,
            lease=lease,
        )
        self.toolset.add_tool(agent_tool)
        return agent_tool

    @overload
    def tool(self, func: F, /) -> F: ...
    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        effects: Effects = "transactional",
        reconcile: Callable[[ToolCall], Awaitable[Any]] | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
        retries: int | None = None,
        args_validator: ArgsValidatorFunc[DepsT, ...] | None = None,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        func: F | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        effects: Effects = "transactional",
        reconcile: Callable[[ToolCall], Awaitable[Any]] | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
        retries: int | None = None,
        args_validator: ArgsValidatorFunc[DepsT, ...] | None = None,
    ) -> F | Callable[[F], F]:
        """Decorator form of `add`, bare (``@tools.tool``) or with options."""

        def register(f: F) -> F:
            self.add(
                f,
                name=name,
                description=description,
                effects=effects,
                reconcile=reconcile,
                volatile=volatile,
                lease=lease,
                retries=retries,
                args_validator=args_validator,
            )
            return f

        return register if func is None else register(func)

    # -- one call ------------------------------------------------------------------------------

    async def _call(
        self,
        ctx: RunContext[DepsT],
        name: str,
        schema: SchemaValidator,
        arguments: dict[str, Any],
    ) -> ToolReturn:
        where = self._where(ctx)
        turn = str(where.turn)
        ordinal = _ordinal(ctx, name, where.scope, turn, schema)
        try:
            action = self.actions.propose(
                name,
                scope=where.scope,
                action_id=f"{turn}.{ordinal}",
                request=to_jsonable_python(arguments),
            )
        except ActionError as exc:
            # Arguments that fit the schema but are no JSON the ledger keeps (an integer past
            # 64 bits): the model's to correct, not the run's end. Nothing was claimed, and the
            # corrected call takes this ordinal (the turn's ids were checked by _where).
            raise ModelRetry(f"The tool's arguments are invalid; nothing was done. {exc}") from exc
        record: dict[str, Any] = {
            "scope": where.scope,
            "turn": turn,
            "tool": name,
            "ordinal": ordinal,
            "key": action.key,
        }
        try:
            result = await self.actions.execute(action, turn=f"{where.scope}/{turn}")
        except ActionInProgress as exc:
            # Not an answer: the retry takes this ordinal again (a retry prompt records none)
            # and gets the first attempt's result.
            raise ModelRetry(
                "This action is already being carried out by an earlier attempt. Call the tool "
                "again with the same arguments to get its result "
                f"(in about {math.ceil(exc.retry_after)} s)."
            ) from exc
        except ActionConflict as exc:
            raise ActionConflict(
                f"call {ordinal} of tool {name!r} in turn {turn!r} ({action.key!r}) already "
                "took effect with other arguments (a field that is not volatile changed since): "
                "nothing was executed; the run stops rather than act twice"
            ) from exc
        except ActionNeedsReview as exc:
            raise ActionNeedsReview(
                f"action {action.key!r} of tool {name!r} needs a person: {exc}"
            ) from exc
        except ActionFailed as exc:
            # A final answer, recorded with its ordinal, so that the model's next call of
            # this tool (a corrected one) is a new action.
            return ToolReturn(
                {"error": "action_failed", "detail": str(exc)},
                metadata={METADATA_KEY: {**record, "failed": True}},
            )
        return ToolReturn(
            result.value, metadata={METADATA_KEY: {**record, "replayed": result.replayed}}
        )

    def _where(self, ctx: RunContext[DepsT]) -> Turn:
        deps = ctx.deps
        where: object
        if self._durable_scope is not None:
            scope = self._durable_scope
            if not isinstance(scope, str):
                scope = scope(deps)
            refusal = _not_durable(ctx)
            if refusal is not None:
                raise ActionError(
                    "ActionTools(durable_scope=...) keys actions by the durable run, but "
                    f"{refusal}. Nothing was done. A run that is not durable is keyed by "
                    "deps=Turn(...), with ActionTools built without durable_scope="
                )
            where = Turn(scope=scope, turn=ctx.run_id or "")
        elif self._turn is not None:
            where = self._turn(deps)
        else:
            where = deps if isinstance(deps, Turn) else getattr(deps, "turn", None)
        if not isinstance(where, Turn):
            raise ConfigurationError(
                f"the run's deps ({type(deps).__name__}) carry no receiver Turn: pass "
                "deps=Turn(scope=..., turn=...), give the deps a 'turn' attribute, or build "
                "ActionTools(actions, turn=lambda deps: ...)"
            )
        return where


#: Pydantic AI's durability capability for each durable runtime (its module under durable_exec).
_CAPABILITIES = {"dbos": "DBOSDurability", "prefect": "PrefectDurability"}


def _not_durable(ctx: RunContext[Any]) -> str | None:
    """Why this run's id would change when its runtime recovers the run (None: it would not).
    Pydantic AI derives the id from the workflow (the flow run) only for an agent with that
    runtime's durability capability; any other agent run inside a workflow, the deprecated
    ``DBOSAgent`` and ``PrefectAgent`` wrappers included, draws a random id each time the
    workflow's code runs. Only a runtime already imported can be running: none is imported."""
    dbos, context = sys.modules.get("dbos"), sys.modules.get("prefect.context")
    inside = {
        "dbos": dbos is not None and dbos.DBOS.workflow_id is not None,
        "prefect": context is not None and context.FlowRunContext.get() is not None,
    }
    running = [runtime for runtime, yes in inside.items() if yes]
    if not running:
        return (
            "no DBOS workflow or Prefect flow is running: run the agent inside one, built with "
            "Pydantic AI's DBOSDurability or PrefectDurability capability"
        )
    for runtime in running:
        module = sys.modules.get(f"pydantic_ai.durable_exec.{runtime}")
        durability, agent = getattr(module, _CAPABILITIES[runtime], None), ctx.agent
        if durability and agent and durability.from_agent(agent) is not None:
            return None
    capability = _CAPABILITIES[running[0]]
    return (
        f"the agent has no {capability} capability, so its run id is random: another each "
        "time the runtime runs the workflow again, and a recovered workflow would act again "
        f"under a new key. Build it as Agent(..., capabilities=[{capability}()]), from "
        f"pydantic_ai.durable_exec.{running[0]} (the deprecated DBOSAgent and PrefectAgent "
        "wrappers draw random run ids too)"
    )


def _split_signature(
    func: Callable[..., Awaitable[Any]], name: str
) -> tuple[str, str, list[inspect.Parameter]]:
    """The names of ``func``'s (call, tx) parameters and the arguments after them."""
    if not inspect.iscoroutinefunction(func):
        raise ConfigurationError(
            f"tool {name!r} must be an 'async def' taking (call, tx, <arguments>)"
        )
    params = list(inspect.signature(func).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) < 2 or any(p.kind not in positional for p in params[:2]):
        raise ConfigurationError(
            f"tool {name!r} must take (call: ToolCall, tx: Connection) first, then its arguments"
        )
    rest = params[2:]
    for p in rest:
        if p.kind not in _KEYWORD:
            raise ConfigurationError(
                f"argument {p.name!r} of tool {name!r}: *args, **kwargs and positional-only "
                "arguments are not supported (the stored request is passed back as keywords)"
            )
    return params[0].name, params[1].name, rest


def _ordinal(
    ctx: RunContext[Any], tool: str, scope: str, turn: str, schema: SchemaValidator
) -> int:
    """This call's ordinal among the tool's calls in the turn (module docstring)."""
    messages: Sequence[ModelMessage] = ctx.messages
    here = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if isinstance(messages[i], ModelResponse)
            and any(_is_call(p, ctx.tool_call_id) for p in messages[i].parts)
        ),
        None,
    )
    if ctx.tool_call_id is None or here is None:
        raise ActionError(
            f"tool {tool!r} was called outside an agent run's tool call (no call in the run's "
            "messages to place it in its turn)"
        )
    answered = {
        part.tool_call_id
        for message in messages[here + 1 :]
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    before = 0
    for part in messages[here].parts:
        if not isinstance(part, ToolCallPart) or part.tool_name != ctx.tool_name:
            continue
        if part.tool_call_id == ctx.tool_call_id:
            break
        if part.tool_call_id not in answered and _valid(schema, part):
            before += 1
    taken = _taken(messages, tool, scope, turn)
    free = (n for n in itertools.count(1) if n not in taken)
    return next(itertools.islice(free, before, None))


def _is_call(part: object, tool_call_id: str | None) -> bool:
    return isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id


def _valid(schema: SchemaValidator, part: ToolCallPart) -> bool:
    """Whether Pydantic AI will run this call (its arguments validate), so it takes an ordinal."""
    try:
        if isinstance(part.args, str):
            schema.validate_json(part.args or "{}")
        else:
            schema.validate_python(part.args or {})
    except ValueError:  # pydantic's ValidationError, or arguments that are not JSON
        return False
    return True


def _taken(messages: Sequence[ModelMessage], tool: str, scope: str, turn: str) -> set[int]:
    """The ordinals of the turn's answered calls of ``tool``, from the answers' metadata."""
    taken: set[int] = set()
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if not isinstance(part, ToolReturnPart) or not isinstance(part.metadata, dict):
                continue
            record = part.metadata.get(METADATA_KEY)
            if (
                isinstance(record, dict)
                and record.get("tool") == tool
                and record.get("scope") == scope
                and record.get("turn") == turn
                and isinstance(record.get("ordinal"), int)
            ):
                taken.add(record["ordinal"])
    return taken
