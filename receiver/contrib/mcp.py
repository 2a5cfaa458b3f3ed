"""MCP tools that take effect once, however often a client retries ``tools/call``: a FastMCP
tool whose every call runs through the `Actions` executor.

    server = FastMCP("shop", token_verifier=..., auth=...)
    keyed = MCPActions(server, Actions(store), scope=authenticated_principal)

    @keyed.tool(volatile=("reason",), destructive=False)
    async def refund_order(call: ToolCall, tx: Connection, order_id: str, cents: int) -> Refund:
        ...

Where the key comes from (never from the model's words, nor from the runtime's own ids):

- the scope is the caller's principal: ``scope=`` is a fixed string (a stdio server runs for
  the one user who launched it) or a function of the request's
  `Context` (`authenticated_principal`: the OAuth subject of
  an HTTP request's bearer token);
- the action id is the client's: ``params._meta["io.receiver/action-id"]`` of ``tools/call``,
  chosen by the client application (not the model) once per logical action, stored with its
  conversation and sent again on every retry. A call without one is refused with a tool error
  and nothing runs. The MCP session id (``Mcp-Session-Id``) is new after every reconnect and
  the JSON-RPC request id is a per-connection counter that starts again at 0, so neither can
  name an action: one gives a retry a new key, the other gives two different actions one key.

What the client sees: the stored result on every retry (structured content too, when the tool
has an output schema), ``_meta["io.receiver/replayed"]`` saying whether it was replayed; the
executor's outcomes as MCP tool errors (``isError``) whose text says what to do: retry after
N seconds (in progress), the stored failure (failed), that a person must review it (needs
review: never a result the model could read as success), that the action id names another
request (conflict). The same facts are the error's structured content, for the client
application: ``{"error": "in_progress", "action_id": ..., "retry_after": N, "message": ...}``
(``error`` is one of ``in_progress``, ``failed``, ``needs_review``, ``conflict``,
``refused``, ``tool_error``, ``tool_raised``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.fastmcp.utilities.func_metadata import FuncMetadata, func_metadata
from mcp.types import CallToolResult, TextContent, ToolAnnotations

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
    "ACTION_ID",
    "REPLAYED",
    "MCPActions",
    "ScopeFunc",
    "action_id_of",
    "authenticated_principal",
]

#: The ``_meta`` key of a ``tools/call`` request that names the action (the client's id).
ACTION_ID = "io.receiver/action-id"
#: The ``_meta`` key of a keyed tool's result: true when it is the stored result of an
#: earlier call with the same action id.
REPLAYED = "io.receiver/replayed"

# The parameter through which FastMCP hands the wrapper its request context; a name a tool's
# own arguments are unlikely to use (FastMCP refuses names that start with "_").
_CONTEXT = "receiver_mcp_context"

ScopeFunc = Callable[[Context[Any, Any, Any]], str]
Effects = Literal["transactional", "external"]
Reconcile = Callable[[ToolCall], Awaitable[Any]]
F = TypeVar("F", bound=Callable[..., Any])


def action_id_of(ctx: Context[Any, Any, Any]) -> str:
    """The client's action id of this ``tools/call`` (``_meta["io.receiver/action-id"]``), or
    a `ToolError` that tells the client how to send one."""
    meta = ctx.request_context.meta
    found = (meta.model_extra or {}).get(ACTION_ID) if meta is not None else None
    if isinstance(found, str) and found.strip():
        return found
    raise ToolError(
        f"missing action id: this tool takes effect once per action, so every call must carry "
        f'params._meta["{ACTION_ID}"], a non-empty string the client application assigns once '
        "per action and sends again on every retry (not the model's call id, not the MCP "
        "session id, not the JSON-RPC id). Nothing was run."
    )


def authenticated_principal(ctx: Context[Any, Any, Any]) -> str:
    """The scope of an HTTP request authenticated by FastMCP's bearer-token auth: the token's
    subject (per issuer, when the token says which), else its OAuth client id.

    Read from this request (not from a context variable set when the session began), so that
    two principals never share a key because they shared a session."""
    request = ctx.request_context.request
    user = request.scope.get("user") if request is not None else None
    token = getattr(user, "access_token", None)
    if token is None:
        raise ToolError(
            "unauthenticated: this server keys actions per authenticated principal; send a "
            "bearer token. Nothing was run."
        )
    issuer = (token.claims or {}).get("iss")
    if token.subject:
        # Each part escaped so that "|" appears only between issuer and subject: a subject
        # without an issuer ("https://idp|ada") can never spell another issuer's principal.
        subject = _escaped(token.subject)
        return f"sub:{_escaped(str(issuer))}|{subject}" if issuer else f"sub:{subject}"
    return f"client:{token.client_id}"


def _escaped(part: str) -> str:
    """``part`` with ``%`` and ``|`` percent-encoded (and nothing else, so that the common
    subjects, an email or a UUID, keep the scope they always had)."""
    return part.replace("%", "%25").replace("|", "%7C")


class MCPActions:
    """Registers tools on a FastMCP server whose calls run through ``actions``, keyed by
    ``scope`` and the client's action id. A tool is ``async def tool(call, tx, **arguments)``:
    ``call`` and ``tx`` as for `add_tool`, then its MCP arguments,
    typed as for any FastMCP tool (they make its input schema; its return annotation makes its
    output schema). The executor may run it again with no MCP request at all (the sweeper
    recovers a transactional tool whose attempt died), so it takes no MCP Context.
    """

    def __init__(self, server: FastMCP[Any], actions: Actions, *, scope: str | ScopeFunc) -> None:
        if isinstance(scope, str) and not scope:
            raise ConfigurationError("scope must be a non-empty string or a function of ctx")
        self.server, self.actions, self.scope = server, actions, scope

    def tool(
        self,
        name: str | None = None,
        *,
        title: str | None = None,
        description: str | None = None,
        effects: Effects = "transactional",
        reconcile: Reconcile | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
        destructive: bool = True,
        structured_output: bool | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of `add_tool`."""

        def register(fn: F) -> F:
            self.add_tool(
                fn,
                name=name,
                title=title,
                description=description,
                effects=effects,
                reconcile=reconcile,
                volatile=volatile,
                lease=lease,
                destructive=destructive,
                structured_output=structured_output,
            )
            return fn

        return register

    def add_tool(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        effects: Effects = "transactional",
        reconcile: Reconcile | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
        destructive: bool = True,
        structured_output: bool | None = None,
    ) -> None:
        """Register ``fn`` on the executor and on the server as the tool ``name`` (default: the
        function's name). ``effects``, ``reconcile``, ``volatile`` and ``lease`` are the
        executor's; ``destructive`` is the tool's ``destructiveHint`` (default true, as in
        the MCP specification: say False for a tool that only adds)."""
        name = name or fn.__name__
        arguments, returns = _split_signature(name, fn)
        # FastMCP's own argument model and result conversion, built from the tool's arguments
        # alone: the request is validated and its result shaped exactly as FastMCP would.
        model = func_metadata(
            _with_signature(fn, name, arguments, returns), structured_output=structured_output
        )

        async def run(call: ToolCall, tx: Connection) -> Any:
            # The arguments come from the stored request (the sweeper's re-run has nothing else).
            parsed = model.arg_model.model_validate(dict(call.request))
            return await fn(call, tx, **parsed.model_dump_one_level())

        self.actions.add_tool(
            name,
            run,
            effects=effects,
            reconcile=reconcile,
            volatile=volatile,
            lease=lease,
        )
        handler = self._handler(name, model)
        context = inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
        returned = (
            Annotated[CallToolResult, returns]
            if model.output_schema is not None
            else CallToolResult
        )
        self.server.add_tool(
            _with_signature(handler, name, [*arguments, context], returned),
            name=name,
            title=title,
            description=description or inspect.getdoc(fn) or "",
            annotations=ToolAnnotations(
                title=title,
                readOnlyHint=False,
                destructiveHint=destructive,
                # A repeat of the same call (same action id) has no further effect.
                idempotentHint=True,
                openWorldHint=effects == "external",
            ),
            meta={ACTION_ID: "required"},
            structured_output=structured_output,
        )
        # FastMCP offers no public way to hand it a tool's result conversion: its tool
        # manager's entry is the one place (tests/contrib/test_mcp.py runs the real package).
        registered = self.server._tool_manager.get_tool(name)
        if registered is not None:
            registered.fn_metadata = _Results.model_construct(**dict(registered.fn_metadata))

    def _handler(self, name: str, model: FuncMetadata) -> Callable[..., Any]:
        async def handler(**kwargs: Any) -> CallToolResult:
            ctx: Context[Any, Any, Any] = kwargs.pop(_CONTEXT)
            action_id = action_id_of(ctx)
            scope = self.scope if isinstance(self.scope, str) else self.scope(ctx)
            request = model.arg_model.model_validate(kwargs).model_dump(mode="json", by_alias=True)
            try:
                action = self.actions.propose(
                    name, scope=scope, action_id=action_id, request=request
                )
                result = await self.actions.execute(action)
            except Exception as exc:  # a cancellation passes through as itself
                return _error_result(action_id, exc)
            converted = model.convert_result(result.value)
            content, structured = converted if isinstance(converted, tuple) else (converted, None)
            return CallToolResult(
                content=list(content),
                structuredContent=structured,
                _meta={REPLAYED: result.replayed},
            )

        return handler


class _Results(FuncMetadata):
    """FastMCP's result conversion of a keyed tool, except that an error result passes as it
    is: FastMCP checks every structured content against the tool's output schema, the one of
    an error (whose facts are not the tool's output, and which MCP clients do not check
    against it) included."""

    def convert_result(self, result: Any) -> Any:
        if isinstance(result, CallToolResult) and result.isError:
            return result
        return super().convert_result(result)


def _error_result(action_id: str, exc: Exception) -> CallToolResult:
    """The executor's outcome as the tool error the client reads (``isError``): its text for
    the model, and the same facts as structured content, for the client application:
    ``{"error": kind, "action_id": ..., "message": ..., "retry_after": seconds}``, the
    seconds only when a retry of the same call will get its result."""
    kind, text, retry_after = _outcome(action_id, exc)
    facts: dict[str, Any] = {"error": kind, "action_id": action_id, "message": text}
    if retry_after is not None:
        facts["retry_after"] = retry_after
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structuredContent=facts, isError=True
    )


def _outcome(action_id: str, exc: Exception) -> tuple[str, str, int | None]:
    """(kind, text, seconds after which to retry the same call, if that will help)."""
    if isinstance(exc, ActionNeedsReview):
        return (
            "needs_review",
            f"needs review: action {action_id!r} cannot be settled automatically ({exc}). A "
            "person must review it before anything else is tried; do not retry it or work "
            "around it with another action id.",
            None,
        )
    if isinstance(exc, ActionFailed):
        return "failed", f"failed: action {action_id!r} failed for good: {exc}", None
    if isinstance(exc, ActionInProgress):
        seconds = max(1, math.ceil(exc.retry_after))
        return (
            "in_progress",
            f"in progress: action {action_id!r} is still running in another attempt; retry "
            f"this same call (same {ACTION_ID}) after {seconds} s for its result",
            seconds,
        )
    if isinstance(exc, ActionConflict):
        return (
            "conflict",
            f"conflict: action id {action_id!r} was already used with different arguments; "
            "nothing was run. An action id names one action: use a new one for another.",
            None,
        )
    if isinstance(exc, ActionError):  # a malformed action id or scope: nothing was claimed
        return "refused", f"refused: {exc}. Nothing was run.", None
    if isinstance(exc, ToolError):  # the tool's own words for the client
        return "tool_error", str(exc), None
    # Its text may carry payload values or internals: name its type only.
    return (
        "tool_raised",
        f"the tool raised {type(exc).__name__}; retry this same call (same {ACTION_ID}): "
        "it runs again only if nothing of this attempt took effect",
        None,
    )


def _split_signature(name: str, fn: Callable[..., Any]) -> tuple[list[inspect.Parameter], Any]:
    """The tool's MCP arguments (its parameters after ``call`` and ``tx``) and its return
    annotation, with string annotations resolved."""
    if not inspect.iscoroutinefunction(fn):
        raise ConfigurationError(f"tool {name!r} must be an 'async def' taking (call, tx, ...)")
    signature = inspect.signature(fn, eval_str=True)
    parameters = list(signature.parameters.values())
    if len(parameters) < 2 or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters[:2]
    ):
        raise ConfigurationError(
            f"tool {name!r} must take (call, tx) first, then its MCP arguments"
        )
    arguments = parameters[2:]
    for p in arguments:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"tool {name!r}: argument {p.name!r} must be a named parameter (it becomes a "
                "field of the tool's input schema)"
            )
        if p.name == _CONTEXT or _mentions_context(p.annotation):
            raise ConfigurationError(
                f"tool {name!r}: a keyed tool takes no MCP Context ({p.name!r}): the executor "
                "may run it again with no MCP request, and its result must not depend on one"
            )
    kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in arguments]
    return kept, signature.return_annotation


def _mentions_context(annotation: Any) -> bool:
    if inspect.isclass(annotation) and issubclass(annotation, Context):
        return True
    return any(_mentions_context(a) for a in getattr(annotation, "__args__", ()))


def _with_signature(
    fn: Callable[..., Any], name: str, parameters: list[inspect.Parameter], returns: Any
) -> Callable[..., Any]:
    """A function calling ``fn`` that FastMCP reads as the tool ``name`` taking ``parameters``
    (its signature, and its annotations, which FastMCP reads apart to find the Context)."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = fn.__module__
    call.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    annotations: dict[str, Any] = {
        p.name: p.annotation for p in parameters if p.annotation is not p.empty
    }
    if returns is not inspect.Signature.empty:
        annotations["return"] = returns
    call.__annotations__ = annotations
    return call
