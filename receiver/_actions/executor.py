"""Actions that AI agents take, once: a deterministic executor on the receipt ledger.

The agent proposes; the executor decides. :meth:`Actions.propose` turns a proposal into an
:class:`Action` whose key (``tenant:action:object:v1``) is built from a scope and an action id
the system assigned, never from text the model wrote, and whose fingerprint is a hash of the
normalized request (sorted keys, trimmed strings, the tool's volatile fields dropped).
:meth:`Actions.execute` claims the key with the ledger's one-statement claim, runs the tool,
stores its result, and hands that stored result back, byte for byte, on every retry. The same
key with another fingerprint is an :class:`~receiver.ActionConflict`, never a second write.

Failure semantics are the webhook pipeline's: an exception releases the claim (fenced) so that
a retry runs the tool again; :class:`~receiver.ActionFailed` is stored as final; a claim whose
lease ran out is run again if the tool is transactional (its writes through ``tx`` died with
the attempt), reconciled if it is external, and marked for review if nothing can reconcile it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, Protocol, TypeVar

import orjson
from prometheus_client import CollectorRegistry

from .._exceptions import (
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    ConfigurationError,
    LeaseLost,
)
from .._ledger import keyed
from .._ledger.cache import ReplayCache
from .._ledger.keyed import KeyState
from .._ledger.receipts import Claim, Claimed, Decision, Key, Receipt, State, StoredResponse, decide
from .._ledger.results import Encoder, NotStorable, RunAgain, dumps
from .._ops.durations import Durations
from .._ops.metrics import Metrics
from .._ops.redact import describe
from .._ops.review import record_review
from .._ops.sweeper import KeySweeper, Recoverer, SweepReport
from .._store.base import Store
from .action import (
    Action,
    ActionResult,
    Effects,
    ReconcileFunc,
    Tool,
    ToolCall,
    ToolFunc,
    action_key,
    downstream_key,
    fingerprint,
    request_body,
    tool_of,
)
from .metrics import ActionMetrics

logger = logging.getLogger("receiver.actions")

F = TypeVar("F", bound=ToolFunc)

_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_JSON = "application/json"
_DAY = 86_400.0


class Receiver(Protocol):
    """What the executor needs of a :class:`~receiver.Receiver` whose store, metrics and
    sweeper it shares (structural: an entry point never imports another)."""

    @property
    def store(self) -> Store: ...
    @property
    def metrics(self) -> Metrics | None: ...
    @property
    def recoverers(self) -> dict[str, Recoverer]: ...


class Actions:
    """The executor. Build it from a Receiver to share its store, metrics and sweeper::

        actions = Actions(rx)

        @actions.tool("refund", effects="external", reconcile=find_refund)
        async def refund(call, tx):
            return await stripe_refund(call.request, idempotency_key=call.downstream_key)

        action = actions.propose("refund", scope="tenant-42", action_id="order-8891",
                                 request={"order": "8891", "amount": 1200})
        result = await actions.execute(action)      # every retry: the same stored result

    ``lease``: how long an attempt holds the key before it counts as dead (a tool's own
    ``lease=`` overrides it). ``window``: how long a key and its result are kept (default 7
    days: retries of agents plus a person resuming a stalled task). ``wait``: how long a
    concurrent duplicate waits for the first attempt's result before ActionInProgress.
    ``replay_cache``: how many completed results this process keeps to answer retries without
    a round trip (0: none). ``encoder``: turns a tool's result that is not JSON into a value
    that is (Decimal, dataclasses, datetimes, UUIDs, enums and Pydantic models need none).

    Built on a bare store, the executor has a sweeper of its own, run every
    ``sweep_interval`` seconds (None: never) while ``async with actions:`` lasts: it recovers
    stale claims nobody retries and deletes expired keys. ``await actions.sweep()`` runs one
    pass (a cron job, ``receiver sweep --store URL`` needs no app for the expiry part).
    """

    def __init__(
        self,
        target: Store | Receiver,
        *,
        lease: float = 60.0,
        window: float = 7 * _DAY,
        wait: float = 5.0,
        metrics: bool = True,
        registry: CollectorRegistry | None = None,
        replay_cache: int = 10_000,
        encoder: Encoder | None = None,
        sweep_interval: float | None = 60.0,
    ) -> None:
        if not 0 < lease <= window:
            raise ConfigurationError(
                f"lease ({lease!r} s) must be positive and within the window ({window!r} s): "
                "a key must not expire while an attempt still holds it"
            )
        if wait < 0:
            raise ConfigurationError(f"wait must be >= 0 seconds, not {wait!r}")
        self.lease, self.window, self.wait = lease, window, wait
        self.encoder = encoder
        #: How long each tool usually takes: a duplicate's retry_after (receiver/_ops/durations.py).
        self.durations = Durations()
        self._tools: dict[str, Tool] = {}
        self._waiters = keyed.Waiters()
        self._cache = ReplayCache(replay_cache) if replay_cache > 0 else None
        self.store: Store
        #: The background sweeper of an executor built on a bare store (started by
        #: ``async with actions:``); built on a Receiver, the Receiver's sweeper does its work.
        self.sweeper: KeySweeper | None = None
        if isinstance(target, Store):
            self.store = target
            if sweep_interval is not None and not sweep_interval > 0:
                raise ConfigurationError(
                    f"sweep_interval must be positive seconds, or None, not {sweep_interval!r}"
                )
            self.sweeper = KeySweeper(target, {keyed.ACTION: self.recover}, sweep_interval)
        else:
            self.store = target.store
            if keyed.ACTION in target.recoverers:
                raise ConfigurationError(
                    "this Receiver already has an action executor: register every tool on that "
                    "one (one executor per receiver recovers its stale claims)"
                )
            if registry is None and target.metrics is not None:
                registry = target.metrics.registry
            # One sweeper for webhooks and actions: stale action claims come back here.
            target.recoverers[keyed.ACTION] = self.recover
        self.metrics: ActionMetrics | None = ActionMetrics(registry) if metrics else None

    async def inspect(self, action: Action | str) -> KeyState | None:
        """What the ledger holds for ``action`` (an Action, or its key), read without acting
        on it: state, fence, failed attempts with their redacted errors, the stored result,
        and whether it needs review. Unlike :meth:`execute`, it never claims or recovers."""
        key = action.key if isinstance(action, Action) else action
        tool = action.tool if isinstance(action, Action) else tool_of(key)
        return await keyed.inspect(self.store, Key(f"{keyed.ACTION}:{tool}", key))

    # -- the sweeper ---------------------------------------------------------------------------

    async def __aenter__(self) -> Actions:
        if self.sweeper is not None:
            self.sweeper.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sweeper is not None:
            await self.sweeper.stop()

    async def sweep(self, *, batch: int = 100) -> SweepReport:
        """One sweeper pass over the executor's store: recover stale action claims (tools
        registered here), delete expired receipts."""
        sweeper = self.sweeper or KeySweeper(self.store, {keyed.ACTION: self.recover}, None)
        return await sweeper.run_once(batch=batch)

    # -- registration --------------------------------------------------------------------------

    def add_tool(
        self,
        name: str,
        func: ToolFunc,
        *,
        effects: Effects = "transactional",
        reconcile: ReconcileFunc | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
    ) -> Tool:
        """Register ``func(call, tx)`` as the tool ``name``. ``volatile`` names request fields
        left out of the fingerprint (timestamps, the model's explanation)."""
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise ConfigurationError(
                f"tool name {name!r} must start with a letter and have at most 64 letters, "
                "digits, '_', '.' or '-'"
            )
        if name in self._tools:
            raise ConfigurationError(f"tool {name!r} is registered twice")
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError(f"tool {name!r} must be an 'async def' taking (call, tx)")
        if effects not in ("transactional", "external"):
            raise ConfigurationError(
                f"effects must be 'transactional' or 'external', not {effects!r}"
            )
        if reconcile is not None and effects != "external":
            raise ConfigurationError(f"reconcile= only applies to effects='external' ({name!r})")
        if reconcile is not None and not inspect.iscoroutinefunction(reconcile):
            raise ConfigurationError(f"reconcile of tool {name!r} must be 'async def'")
        if lease is not None and not 0 < lease <= self.window:
            raise ConfigurationError(f"lease of tool {name!r} must be in (0, window]")
        tool = Tool(name, func, effects, reconcile, frozenset(volatile), lease)
        self._tools[name] = tool
        if self.metrics is not None:
            self.metrics.add_action(name)
        return tool

    def tool(
        self,
        name: str,
        *,
        effects: Effects = "transactional",
        reconcile: ReconcileFunc | None = None,
        volatile: Iterable[str] = (),
        lease: float | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`add_tool`."""

        def register(func: F) -> F:
            self.add_tool(
                name, func, effects=effects, reconcile=reconcile, volatile=volatile, lease=lease
            )
            return func

        return register

    # -- proposing and executing ---------------------------------------------------------------

    def propose(
        self,
        tool: str,
        *,
        scope: str,
        action_id: str,
        request: Mapping[str, Any],
        version: int = 1,
    ) -> Action:
        """The action's key and fingerprint. ``scope`` (the tenant) and ``action_id`` are the
        system's (an order id, a queue row id), never the model's words."""
        found = self._tool(tool)
        for name, part in (("scope", scope), ("action_id", action_id)):
            if not isinstance(part, str) or not part or len(part) > 200:
                raise ActionError(f"{name} must be a non-empty string of at most 200 characters")
        if not isinstance(request, Mapping):
            raise ActionError("the action's request must be a JSON object (a mapping)")
        return Action(
            tool,
            scope,
            action_id,
            version,
            action_key(scope, tool, action_id, version),
            request,
            fingerprint(request, found.volatile),
        )

    async def execute(self, action: Action, *, turn: str | None = None) -> ActionResult:
        """Run the action once; every later call returns the stored result unchanged.

        Raises ActionConflict (the key was used with another request), ActionInProgress
        (another attempt still runs it after ``wait`` seconds), ActionFailed (stored as failed;
        ActionNeedsReview for an interrupted external tool), or the tool's own exception (the
        claim was released: retrying runs it again).
        """
        tool = self._tool(action.tool)
        if turn is not None and self.metrics is not None:
            self.metrics.turn(tool.name, turn, action.key)
        claim = self._claim(tool, action, request_body(action.request))
        hit = None if self._cache is None else self._cache.get(claim.key, time.time())
        if hit is not None:
            if hit.payload_hash != action.fingerprint:
                self._conflict(tool, action)
            if self.metrics is not None:
                self.metrics.replays.labels(tool.name).inc()
            return ActionResult(action.key, hit.response.body, replayed=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        for _ in range(100):  # each pass is one decision by the database; a few in practice
            got = await keyed.claim(self.store, claim)
            if isinstance(got, Claimed):
                return await self._run(tool, action, got.fence, turn)
            receipt = got
            decision = decide(receipt, action.fingerprint)
            if decision is Decision.REPLAY:
                return self._replayed(tool, action, receipt)
            if decision is Decision.MISMATCH:
                self._conflict(tool, action)
            if decision is Decision.IN_FLIGHT:
                left = deadline - loop.time()
                if left > 0:
                    latest = await self._waiters.wait(self.store, claim.key, left)
                    if latest is None or not keyed.live(latest) or loop.time() < deadline:
                        continue
                    receipt = latest
                raise ActionInProgress(
                    f"action {action.key!r} is being executed by another attempt; retry later",
                    retry_after=float(
                        self.durations.retry_after(
                            tool.name,
                            receipt.now - receipt.claimed_at,
                            receipt.lease_until - receipt.now,
                        )
                    ),
                )
            if decision is Decision.RECOVER and tool.effects == "external":
                return await self._recover_external(tool, action, receipt, turn)
            fence = await keyed.reclaim(self.store, claim, receipt.fence)
            if fence is not None:
                if decision is Decision.RECOVER:  # transactional: nothing of it committed
                    self._count_stale(tool, "recovered")
                return await self._run(tool, action, fence, turn)
            # Another attempt took it over between our read and our update: look again.
        raise ActionInProgress(f"action {action.key!r} keeps changing hands; retry later")

    async def recover(self, receipt: Receipt) -> str:
        """The sweeper's recovery of a stale action claim nobody retries: transactional tools
        run again, external ones are reconciled or marked for review. One of
        ``recovered``, ``failed``, ``released``, ``skipped``."""
        tool = self._tools.get(receipt.event_type or "")
        if tool is None or receipt.request_body is None:
            return "skipped"  # registered in another process: its own executor recovers it
        action = self._restore(tool, receipt)
        try:
            if tool.effects == "external":
                await self._recover_external(tool, action, receipt, None)
            else:
                claim = self._claim(tool, action, receipt.request_body)
                fence = await keyed.reclaim(self.store, claim, receipt.fence)
                if fence is None:
                    return "skipped"
                await self._run(tool, action, fence, None)
        except ActionInProgress:
            result = "skipped"
        except ActionNeedsReview:
            return "failed"  # counted by _recover_external
        except ActionFailed:
            result = "recovered"  # a final answer was stored
        except Exception:
            result = "released"
        else:
            result = "recovered"
        self._count_stale(tool, result)
        return result

    # -- the steps -----------------------------------------------------------------------------

    def _tool(self, name: str) -> Tool:
        tool = self._tools.get(name)
        if tool is None:
            raise ActionError(f"no tool named {name!r}; registered: {sorted(self._tools)}")
        return tool

    def _claim(self, tool: Tool, action: Action, body: bytes) -> Claim:
        return Claim(
            Key(f"{keyed.ACTION}:{tool.name}", action.key),
            action.fingerprint,
            tool.name,
            body,
            self.store.now(),
            tool.lease or self.lease,
            self.window,
        )

    async def _run(
        self, tool: Tool, action: Action, fence: int, turn: str | None, *, answer: Any = None
    ) -> ActionResult:
        """Run the tool and store its result in one transaction, fenced (the tool's writes
        through ``tx`` commit with it or not at all). With ``answer`` (a reconciled result)
        the tool is not called and ``answer`` is stored.

        Once an external tool has returned, its effect has happened: nothing after that point
        (a result that is not JSON, a failed completion, a cancellation) releases the claim,
        since a release would let the next retry call the tool again.
        """
        key = Key(f"{keyed.ACTION}:{tool.name}", action.key)
        call = ToolCall(action, fence, downstream_key(action.key), turn)
        external = tool.effects == "external"
        returned = False
        failure: BaseException | None = None
        with self._waiters.running(key):
            async with self.store.lazy() as tx:
                try:
                    async with tx.deferred_transaction():
                        began = time.monotonic()
                        result = await tool.func(call, tx) if answer is None else answer
                        returned = True
                        if answer is None:
                            self.durations.observe(tool.name, time.monotonic() - began)
                        stored = StoredResponse(200, _JSON, dumps(result, self.encoder))
                        await keyed.complete(self.store, tx, key, fence, stored)
                except (Exception, asyncio.CancelledError) as exc:
                    # Decided below, outside the rolled-back transaction.
                    failure = exc
            if failure is None:
                if self.metrics is not None:
                    self.metrics.executions.labels(tool.name).inc()
                self._remember(key, action, stored, self.window)
                return ActionResult(action.key, stored.body, replayed=False)
            if isinstance(failure, LeaseLost):
                if returned:
                    await self._ran_twice(tool, key, fence)
                raise ActionInProgress(
                    f"a newer attempt owns action {action.key!r}; this one was rolled back"
                ) from failure
            if isinstance(failure, NotStorable) and returned:
                if external:
                    await self._not_storable(tool, key, fence, failure)
                # Transactional: its writes rolled back with the completion, so nothing of the
                # attempt stands and the claim is released below, with the reason named.
                cause, failure = failure, ActionError(f"tool {tool.name!r} returned {failure}")
                failure.__cause__ = cause
            elif isinstance(failure, ActionFailed):
                body = orjson.dumps({"error": "action_failed", "detail": str(failure)})
                failed = StoredResponse(422, _JSON, body)
                await keyed.complete(self.store, None, key, fence, failed, State.FAILED)
                raise failure
            elif external and (returned or isinstance(failure, asyncio.CancelledError)):
                # The effect happened (or may have: the call was cut off mid-way), and only its
                # recording failed. The claim stays in flight: when its lease runs out, the
                # next attempt or the sweeper asks reconcile() instead of calling the tool again.
                logger.error(
                    "external tool %s was interrupted after it was called (%s); left in flight "
                    "for reconcile",
                    tool.name,
                    type(failure).__name__,
                    extra={"action": tool.name, "fence": fence},
                )
                raise failure
            else:
                logger.warning(
                    "tool %s failed; claim released for a retry (%s)",
                    tool.name,
                    type(failure).__name__,
                    extra={"action": tool.name, "fence": fence},
                )
            # Nothing of the attempt committed: give the key back at once (a cancelled attempt
            # too, so that a retry is not told "in progress" until the lease runs out). Shielded,
            # so that a second cancellation cannot leave the key held.
            await asyncio.shield(keyed.release(self.store, key, fence, describe(failure)))
            raise failure

    async def _not_storable(self, tool: Tool, key: Key, fence: int, exc: NotStorable) -> None:
        """An external tool acted and returned what cannot be stored: store that as a failure
        that needs a person (every retry sees it), never as a reason to run the tool again."""
        logger.error(
            "ALERT: external tool %s returned a %s, which cannot be stored as JSON; its effect "
            "happened, so the action is marked for review (pass encoder= to store such results)",
            tool.name,
            exc.type_name,
            extra={"action": tool.name, "fence": fence},
        )
        detail = (
            f"the external tool acted but returned a {exc.type_name}, which cannot be stored; "
            "an operator was alerted"
        )
        await self._store_review(key, fence, detail)
        self._count_stale(tool, "failed")
        raise ActionNeedsReview(detail) from exc

    def _replayed(self, tool: Tool, action: Action, receipt: Receipt) -> ActionResult:
        response = receipt.response
        assert response is not None
        if self.metrics is not None:
            self.metrics.replays.labels(tool.name).inc()
        if receipt.state is State.FAILED:
            stored = orjson.loads(response.body)
            error = ActionNeedsReview if stored.get("error") == "needs_review" else ActionFailed
            raise error(str(stored.get("detail")))
        self._remember(receipt.key, action, response, receipt.expires_at - receipt.now)
        return ActionResult(action.key, response.body, replayed=True)

    def _remember(self, key: Key, action: Action, stored: StoredResponse, left: float) -> None:
        """A completed action's result never changes until it expires: keep it, so that this
        process answers its retries without a round trip."""
        if self._cache is not None:
            self._cache.put(key, action.fingerprint, stored, time.time() + left)

    def _conflict(self, tool: Tool, action: Action) -> NoReturn:
        logger.warning(
            "ALERT: action key reused with a different request (fingerprint): not executed",
            extra={"action": tool.name, "scope": action.scope, "action_id": action.action_id},
        )
        if self.metrics is not None:
            self.metrics.conflicts.labels(tool.name).inc()
        raise ActionConflict(
            f"action {action.key!r} was already executed (or started) with a different "
            "request: an action id names one effect; propose a new action id for another"
        )

    async def _recover_external(
        self, tool: Tool, action: Action, receipt: Receipt, turn: str | None
    ) -> ActionResult:
        """An attempt of an external tool died or stalled: never re-run it blindly."""
        key = Key(f"{keyed.ACTION}:{tool.name}", action.key)
        claim = self._claim(tool, action, receipt.request_body or request_body(action.request))
        fence = await keyed.reclaim(self.store, claim, receipt.fence)
        if fence is None:
            raise ActionInProgress(f"action {action.key!r} is being recovered by another attempt")
        if tool.reconcile is None:
            logger.error(
                "ALERT: interrupted external tool has no reconcile(); action marked for review",
                extra={"action": tool.name, "scope": action.scope, "action_id": action.action_id},
            )
            detail = (
                "an attempt of this external tool was interrupted and it has no reconcile(): it "
                "cannot be safely re-run; "
                "an operator was alerted"
            )
            await self._store_review(key, fence, detail)
            self._count_stale(tool, "failed")
            raise ActionNeedsReview(detail)
        call = ToolCall(action, fence, downstream_key(action.key), turn)
        try:
            answer = await tool.reconcile(call)
        except Exception as exc:
            # What happened outside is still unknown: never released (a release would let the
            # retry call the tool again); the lease ends now, so the next attempt reconciles.
            await keyed.unresolved(self.store, key, fence, f"reconcile: {describe(exc)}")
            raise
        logger.warning(
            "interrupted external tool reconciled (%s)",
            "running it again" if isinstance(answer, RunAgain) else "its effect happened",
            extra={"action": tool.name, "fence": fence},
        )
        if isinstance(answer, RunAgain):
            return await self._run(tool, action, fence, turn)
        return await self._run(tool, action, fence, turn, answer=answer)

    async def _store_review(self, key: Key, fence: int, detail: str) -> None:
        """The final answer that needs a person, with the reason kept as the attempt's error
        (what ``inspect`` and ``receiver failed`` show)."""
        body = orjson.dumps({"error": "needs_review", "detail": detail})
        async with self.store.acquire() as conn:
            await record_review(
                conn, key, fence, StoredResponse(409, _JSON, body), detail, self.store.now()
            )

    async def _ran_twice(self, tool: Tool, key: Key, fence: int) -> None:
        """The tool ran to the end and its fenced completion was refused: if another attempt
        completed the key, the tool ran to the end twice (its tx writes rolled back)."""
        receipt = await keyed.lookup(self.store, key)
        if receipt is None or receipt.state is not State.COMPLETED:
            return
        logger.error(
            "ALERT: double execution: tool %s ran to the end twice for one action key",
            tool.name,
            extra={"action": tool.name, "fence": fence},
        )
        if self.metrics is not None:
            self.metrics.double_executions.labels(tool.name).inc()

    def _restore(self, tool: Tool, receipt: Receipt) -> Action:
        """The action of a stored claim (its key and request are in the ledger)."""
        scope, _, action_id, version = (*receipt.key.webhook_id.split(":"), "")[:4]
        request = orjson.loads(receipt.request_body or b"{}")
        return Action(
            tool.name,
            urllib.parse.unquote(scope),
            urllib.parse.unquote(action_id),
            int(version.removeprefix("v") or 1),
            receipt.key.webhook_id,
            request,
            receipt.payload_hash,
        )

    def _count_stale(self, tool: Tool, result: str | None) -> None:
        if result is not None and self.metrics is not None:
            self.metrics.stale_claims.labels(tool.name, result).inc()

    def __repr__(self) -> str:
        return f"Actions(store={self.store.url!r}, tools={sorted(self._tools)!r})"
