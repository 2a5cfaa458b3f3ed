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
import copy
import inspect
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from .._exceptions import (
    ActionError,
    ActionFailed,
    ActionInProgress,
    ActionNeedsReview,
    ConfigurationError,
)
from .._ledger import keyed
from .._ledger.cache import ReplayCache
from .._ledger.keyed import KeyState
from .._ledger.receipts import Claimed, Decision, Key, Receipt, decide
from .._ledger.results import Encoder
from .._ops.durations import Durations
from .._ops.metrics import Metrics
from .._ops.sweeper import (
    AUDIT_RETENTION,
    DEAD_LETTER_RETENTION,
    KeySweeper,
    Recoverer,
    SweepReport,
)
from .._store.base import Store
from .._values import names, seconds
from .._values import sweep_interval as checked_interval
from .action import (
    Action,
    ActionResult,
    Effects,
    ReconcileFunc,
    Tool,
    ToolFunc,
    action_key,
    fingerprint,
    request_body,
    tool_of,
)
from .metrics import ActionMetrics
from .steps import Steps

logger = logging.getLogger("receiver.actions")

F = TypeVar("F", bound=ToolFunc)

_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
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
    @property
    def dead_letter_retention(self) -> float: ...
    @property
    def audit_retention(self) -> float: ...


class Actions(Steps):
    """The executor. Build it from a Receiver to share its store, metrics and sweeper:

    ```python
    actions = Actions(rx)

    @actions.tool("refund", effects="external", reconcile=find_refund)
    async def refund(call, tx):
        return await stripe_refund(call.request, idempotency_key=call.downstream_key)

    action = actions.propose("refund", scope="tenant-42", action_id="order-8891",
                             request={"order": "8891", "amount": 1200})
    result = await actions.execute(action)      # every retry: the same stored result
    ```

    ``lease``: how long an attempt holds the key before it counts as dead (a tool's own
    ``lease=`` overrides it). ``window``: how long a key and its result are kept (default 7
    days: retries of agents plus a person resuming a stalled task). ``wait``: how long a
    concurrent duplicate waits for the first attempt's result before ActionInProgress.
    ``replay_cache``: how many completed results this process keeps to answer retries without
    a round trip (0: none). ``encoder``: turns a tool's result that is not JSON into a value
    that is (Decimal, dataclasses, datetimes, UUIDs, enums and Pydantic models need none).

    Built on a bare store, the executor has a sweeper of its own, run every
    ``sweep_interval`` seconds (None: never) while ``async with actions:`` lasts: it recovers
    stale claims nobody retries and deletes expired keys (keeping a failed one
    ``dead_letter_retention`` seconds after its window, and the console's audit records
    ``audit_retention`` seconds, as the Receiver's does). ``await actions.sweep()`` runs one
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
        dead_letter_retention: float | None = None,
        audit_retention: float | None = None,
    ) -> None:
        # inf overflowed the stored expiry timestamps
        window, wait = seconds("window", window), seconds("wait", wait, zero=True)
        lease = seconds("lease", lease)
        if not lease <= window:
            raise ConfigurationError(
                f"lease ({lease!r} s) must be positive and within the window ({window!r} s): "
                "a key must not expire while an attempt still holds it"
            )
        if isinstance(replay_cache, bool) or not isinstance(replay_cache, int):
            raise ConfigurationError(
                f"replay_cache is a number of results (0: none), not {replay_cache!r}"
            )
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
            sweep_interval = checked_interval(sweep_interval)
            self._retention = (
                DEAD_LETTER_RETENTION if dead_letter_retention is None else dead_letter_retention,
                AUDIT_RETENTION if audit_retention is None else audit_retention,
            )
            self.sweeper = KeySweeper(
                target,
                {keyed.ACTION: self.recover},
                sweep_interval,
                retention=self._retention[0],
                audit_retention=self._retention[1],
            )
        else:
            self.store = target.store
            if dead_letter_retention is not None or audit_retention is not None:
                raise ConfigurationError(
                    "built on a Receiver, the executor is swept by the Receiver's sweeper: give "
                    "dead_letter_retention and audit_retention to the Receiver"
                )
            self._retention = (target.dead_letter_retention, target.audit_retention)
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
        and whether it needs review. Unlike `execute`, it never claims or recovers."""
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
        sweeper = self.sweeper or KeySweeper(
            self.store,
            {keyed.ACTION: self.recover},
            None,
            retention=self._retention[0],
            audit_retention=self._retention[1],
        )
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
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
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
        listed = names(
            volatile, f"volatile of tool {name!r} takes a list of field names, such as ['reason']"
        )
        if lease is not None and not seconds(f"lease of tool {name!r}", lease) <= self.window:
            raise ConfigurationError(f"lease of tool {name!r} must be in (0, window]")
        tool = Tool(name, func, effects, reconcile, frozenset(listed), lease)
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
        """Decorator form of `add_tool`."""

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
            if not part.isprintable():  # no control character, lone surrogate or line break
                raise ActionError(f"{name} must be printable text (no control characters)")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ActionError(f"version must be a whole number from 1, not {version!r}")
        if not isinstance(request, Mapping):
            raise ActionError("the action's request must be a JSON object (a mapping)")
        fingerprinted = fingerprint(request, found.volatile)  # refuses what is not JSON
        return Action(
            tool,
            scope,
            action_id,
            version,
            action_key(scope, tool, action_id, version),
            # A copy: the caller changing its dict afterwards must not change what runs.
            copy.deepcopy(dict(request)),
            fingerprinted,
        )

    async def execute(self, action: Action, *, turn: str | None = None) -> ActionResult:
        """Run the action once; every later call returns the stored result unchanged.

        Raises ActionConflict (the key was used with another request), ActionInProgress
        (another attempt still runs it after ``wait`` seconds), ActionFailed (stored as failed;
        ActionNeedsReview for an interrupted external tool), or the tool's own exception (the
        claim was released: retrying runs it again).
        """
        if not isinstance(action, Action):
            raise ActionError(
                f"execute() takes the Action propose() made, not a {type(action).__name__}"
            )
        tool = self._tool(action.tool)
        if turn is not None and not isinstance(turn, str):
            # A list was an unhashable TypeError from the metrics; a number, a silent label.
            raise ActionError(
                f"turn names a conversation turn: a string, not a {type(turn).__name__}"
            )
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

    def __repr__(self) -> str:
        return f"Actions(store={self.store.url!r}, tools={sorted(self._tools)!r})"
