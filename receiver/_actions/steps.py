"""The executor's steps once it has decided to act: claim, run the tool and store its result in
one fenced transaction, or give the attempt back; the recovery of an interrupted external tool
(reconciled, never re-run blindly, or marked for review); and the answers those steps give
(a replay, a conflict)."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from typing import Any, NoReturn

import orjson

from .._exceptions import (
    ActionConflict,
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    LeaseLost,
)
from .._ledger import keyed
from .._ledger.cache import ReplayCache
from .._ledger.receipts import Claim, Key, Receipt, State, StoredResponse
from .._ledger.results import Encoder, NotStorable, RunAgain, dumps
from .._ops.durations import Durations
from .._ops.redact import describe, message
from .._ops.review import record_review
from .._store.base import Store
from .action import (
    Action,
    ActionResult,
    Tool,
    ToolCall,
    downstream_key,
    request_body,
)
from .metrics import ActionMetrics

logger = logging.getLogger("receiver.actions")

_JSON = "application/json"


class Steps:
    """What :class:`~receiver.Actions` does once it has decided to act."""

    store: Store
    lease: float
    window: float
    encoder: Encoder | None
    durations: Durations
    metrics: ActionMetrics | None
    _tools: dict[str, Tool]
    _waiters: keyed.Waiters
    _cache: ReplayCache | None

    def _tool(self, name: str) -> Tool:
        if not isinstance(name, str):
            raise ActionError(f"a tool is named by a string, not a {type(name).__name__}")
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
                body = orjson.dumps({"error": "action_failed", "detail": message(failure)})
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
