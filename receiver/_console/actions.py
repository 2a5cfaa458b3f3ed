"""What an operator can do from the console, each recorded in the ledger's audit table.

- **Replay** a failed, released or stale delivery: the Receiver's own replay (the claim and
  fence path of ``receiver replay``). It always runs: an operator is never answered with a
  stored answer, unlike a sender's redelivery, which stays deduplicated.
- **Re-run** a completed delivery, deliberately (after a handler bug was fixed): the receipt is
  given back under a compare-and-set on its fence, in one transaction with its audit record,
  with the payload the operator supplies (a completed receipt no longer keeps its body), which
  must hash to the receipt's payload hash; then it is replayed like a dead letter. The handlers
  run once more under the next fence and their completion is an ordinary one, so no double
  execution is counted: the audit record says who re-ran it and why.
- **Settle** a receipt that needs review: resolved (reconciled by hand; stored as completed,
  with the answer the operator gives or ``{"status":"resolved"}``), or stored as a final
  failure. Fenced, in one transaction with its audit record.

Bad input (no reason, a payload that is not this delivery's) is refused before anything is
written. A replay is recorded before it runs (so an interrupted one still shows), and its
outcome when it ends, refusals and failures included. ``receiver replay`` replays through
:func:`replay` too, so that every operator action, from the console or the command line, is
one audit row with its outcome.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from .._exceptions import ReceiverError
from .._ledger import keyed
from .._ledger import receipts as ledger
from .._ledger.receipts import Key, Receipt, State, StoredResponse
from .._ops.metrics import Metrics
from .._store.base import Connection, Store
from .._verification.payload import parse

JSON = "application/json"
MAX_REASON = 2000

RESOLVED = b'{"status":"resolved"}'
#: A webhook stored as failed keeps a 2xx for its sender (a retry would change nothing).
FAILED_WEBHOOK = b'{"status":"failed","detail":"reviewed by an operator and stored as failed"}'
#: An action stored as failed: the executor raises ActionFailed with this detail on a retry.
FAILED_ACTION = b'{"error":"action_failed","detail":"reviewed by an operator and stored as failed"}'
#: A proxied request stored as failed: every retry of its key is answered this 422.
FAILED_REQUEST = (
    b'{"error":"request_failed","detail":"reviewed by an operator and stored as failed"}'
)


class ActionRefused(ReceiverError):
    """The console did not act: the reason says why, and what changed (nothing, unless said)."""


class ResponseLike(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def body(self) -> bytes | memoryview: ...


class ReplyLike(Protocol):
    """What a Receiver's replay returns (receiver.Reply)."""

    @property
    def outcome(self) -> str: ...
    @property
    def response(self) -> ResponseLike: ...
    @property
    def fence(self) -> int | None: ...


Replayer = Callable[[str, str], Awaitable[ReplyLike]]


class WindowLike(Protocol):
    @property
    def window(self) -> float: ...


class ProviderLike(Protocol):
    @property
    def window(self) -> WindowLike: ...


class ReceiverLike(Protocol):
    """What the console uses of a :class:`~receiver.Receiver` (named structurally, so that the
    console does not import the entry point that mounts it)."""

    @property
    def store(self) -> Store: ...
    @property
    def providers(self) -> Mapping[str, ProviderLike]: ...
    @property
    def metrics(self) -> Metrics | None: ...
    async def replay(self, provider: str, webhook_id: str) -> ReplyLike: ...


#: The outcomes of a replay that did what the operator asked: the handlers ran (or had
#: nothing to run, or the stored payload is answered 4xx for good), or the delivery went back
#: to the workers. Any other outcome (the handlers failed again, ...) is a failed replay.
SUCCEEDED = frozenset({"executed", "ignored", "invalid_payload", "reconciled", "queued"})


@dataclass(frozen=True, slots=True)
class Done:
    """What an action did, for the page (or the command) that follows it."""

    audit_id: int
    outcome: str
    detail: str
    #: False when the action ran but did not do what was asked (a replay whose handlers
    #: failed again): said so, never shown as a success.
    ok: bool = True
    #: A replay's answer (the command line prints its body).
    reply: ReplyLike | None = None

    def notice(self, action: str) -> str:
        """One line for the operator: ``Replayed: executed (HTTP 200, fence 3)``, or
        ``Replay FAILED: handler_failed (...)``."""
        verb = {"replay": ("Replayed", "Replay"), "rerun": ("Re-run", "Re-run")}[action]
        if self.ok:
            return f"{verb[0]}: {self.outcome} ({self.detail})"
        return f"{verb[1]} FAILED: {self.outcome} ({self.detail})"


def reason_of(text: str) -> str:
    reason = " ".join(text.split())
    if not reason:
        raise ActionRefused("say why: the reason is recorded with the action, and is required")
    if len(reason) > MAX_REASON:
        raise ActionRefused(f"the reason is limited to {MAX_REASON} characters")
    return reason


async def _record(
    conn: Connection,
    store: Store,
    actor: str,
    action: str,
    key: Key,
    fence: int | None,
    reason: str,
    outcome: str | None,
    detail: str | None = None,
) -> int:
    row = await conn.run(
        "console_audit_add",
        store.now(),
        actor,
        action,
        key.provider,
        key.webhook_id,
        fence,
        reason,
        outcome,
    )
    assert row is not None
    audit_id = int(row["id"])
    if detail is not None:
        await conn.run("console_audit_done", audit_id, outcome, detail)
    return audit_id


async def _finish(store: Store, audit_id: int, outcome: str, detail: str) -> None:
    async with store.acquire() as conn:
        await conn.run("console_audit_done", audit_id, outcome, detail[:MAX_REASON])


async def _current(store: Store, key: Key, fence: int | None) -> Receipt:
    """The receipt as the operator saw it (same fence; any fence for None, from a command
    line that did not look first), or a refusal."""
    async with store.acquire() as conn:
        receipt = await ledger.lookup(conn, key, store.now())
    if receipt is None:
        raise ActionRefused(f"no receipt for {key.provider}/{key.webhook_id}")
    if fence is not None and receipt.fence != fence:
        raise ActionRefused(
            f"{key.provider}/{key.webhook_id} changed since you looked (fence {fence}, now "
            f"{receipt.fence}): look again"
        )
    return receipt


def _described(reply: ReplyLike) -> str:
    if reply.fence is None:  # queued again: the workers' attempt takes the next fence
        return f"HTTP {reply.response.status_code}, due now for the workers"
    return f"HTTP {reply.response.status_code}, fence {reply.fence}"


def _replayed(audit_id: int, reply: ReplyLike) -> Done:
    outcome = str(reply.outcome)
    return Done(audit_id, outcome, _described(reply), outcome in SUCCEEDED, reply)


async def replay(
    store: Store, replayer: Replayer, actor: str, key: Key, fence: int | None, reason_text: str
) -> Done:
    """Run a stored failed, released or stale delivery again (never a completed one).
    ``fence`` is the one the operator saw (None: whichever is current)."""
    reason = reason_of(reason_text)
    fence = (await _current(store, key, fence)).fence
    async with store.acquire() as conn:
        audit_id = await _record(conn, store, actor, "replay", key, fence, reason, None)
    try:
        reply = await replayer(key.provider, key.webhook_id)
    except ReceiverError as exc:
        await _finish(store, audit_id, "refused", str(exc))
        raise ActionRefused(str(exc)) from exc
    except BaseException as exc:
        await _finish(store, audit_id, "error", type(exc).__name__)
        raise
    done = _replayed(audit_id, reply)
    await _finish(store, audit_id, done.outcome, done.detail)
    return done


async def rerun(
    store: Store,
    replayer: Replayer,
    actor: str,
    key: Key,
    fence: int,
    reason_text: str,
    payload: bytes,
    confirmation: str,
) -> Done:
    """Deliberately run a completed delivery's handlers again (see the module docstring)."""
    reason = reason_of(reason_text)
    if confirmation.strip() != key.webhook_id:
        raise ActionRefused(
            "not confirmed: type the webhook-id of the delivery to run its handlers again"
        )
    if keyed.namespace(key.provider) is not None:
        raise ActionRefused(
            "only webhook deliveries are re-run here: an agent action or an Idempotency-Key "
            "request runs again when its caller sends it again (under a new key for actions)"
        )
    receipt = await _current(store, key, fence)
    if receipt.state is not State.COMPLETED:
        raise ActionRefused(
            f"{key.provider}/{key.webhook_id} is {receipt.state.value}, not completed: "
            "replay it instead"
        )
    if parse(payload, receipt.event_type).payload_hash != receipt.payload_hash:
        raise ActionRefused(
            "this payload is not the delivery's: its normalized hash differs from the "
            "receipt's payload hash (paste the event exactly as the sender sent it)"
        )
    async with store.acquire() as conn, conn.transaction():
        args = (key.provider, key.webhook_id, fence, receipt.payload_hash, store.now(), payload)
        reopened = await conn.run("console_reopen_completed", *args)
        requeued = None if reopened else await conn.run("console_requeue_completed", *args)
        if reopened is None and requeued is None:
            raise ActionRefused(f"{key.provider}/{key.webhook_id} changed meanwhile: look again")
        outcome = None if requeued is None else "queued"
        detail = None if requeued is None else "due now for the workers"
        audit_id = await _record(conn, store, actor, "rerun", key, fence, reason, outcome, detail)
    if requeued is not None:
        return Done(audit_id, "queued", "due now for the workers")
    try:
        reply = await replayer(key.provider, key.webhook_id)
    except ReceiverError as exc:
        detail = f"reopened, but the replay did not run: {exc}; replay it"
        await _finish(store, audit_id, "refused", detail)
        raise ActionRefused(detail) from exc
    except BaseException as exc:
        await _finish(store, audit_id, "error", type(exc).__name__)
        raise
    done = _replayed(audit_id, reply)
    await _finish(store, audit_id, done.outcome, done.detail)
    return done


async def settle(
    store: Store,
    actor: str,
    key: Key,
    fence: int,
    decision: str,
    reason_text: str,
    answer_text: str = "",
) -> Done:
    """Resolve (``decision="resolve"``) or fail (``"fail"``) a receipt that needs review."""
    reason = reason_of(reason_text)
    if decision not in ("resolve", "fail"):
        raise ActionRefused(f"unknown decision {decision!r}")
    answer = answer_text.strip().encode()
    if answer:
        if decision != "resolve":
            raise ActionRefused("an answer is stored only when resolving")
        try:
            orjson.loads(answer)
        except orjson.JSONDecodeError:
            raise ActionRefused("the answer to store must be JSON") from None
    receipt = await _current(store, key, fence)
    if not keyed.needs_review(receipt):
        raise ActionRefused(
            f"{key.provider}/{key.webhook_id} does not need review ({receipt.state.value})"
        )
    is_action = keyed.namespace(key.provider) == keyed.ACTION
    if decision == "resolve":
        state, stored = State.COMPLETED, StoredResponse(200, JSON, answer or RESOLVED)
        outcome = "resolved"
    elif is_action:
        state, stored, outcome = State.FAILED, StoredResponse(422, JSON, FAILED_ACTION), "failed"
    elif keyed.namespace(key.provider) == "proxy":
        state, stored, outcome = State.FAILED, StoredResponse(422, JSON, FAILED_REQUEST), "failed"
    else:
        state, stored, outcome = State.FAILED, StoredResponse(202, JSON, FAILED_WEBHOOK), "failed"
    action = "resolve" if decision == "resolve" else "fail"
    async with store.acquire() as conn, conn.transaction():
        settled = await conn.run(
            "console_settle",
            key.provider,
            key.webhook_id,
            fence,
            state.value,
            stored.status,
            stored.content_type,
            stored.body,
            store.now(),
        )
        if settled is None:
            raise ActionRefused(f"{key.provider}/{key.webhook_id} changed meanwhile: look again")
        detail = f"stored as {state.value}, HTTP {stored.status}"
        audit_id = await _record(conn, store, actor, action, key, fence, reason, outcome, detail)
    return Done(audit_id, outcome, detail)
