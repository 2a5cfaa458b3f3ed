"""Dead-letter replay: run a stored delivery again, through the same claim and fence path.

A receipt keeps the verified request body until it completes, so a delivery whose handlers
failed (``released``, waiting for a retry the sender may never send), that was marked
``failed`` (an interrupted external handler without ``reconcile``, an unrecoverable stale
claim), or whose attempt died (in flight, lease expired) can be run again by an operator:

- a ``failed`` receipt is first reopened to ``released`` (the ``reopen`` statement: a
  compare-and-set on its fence);
- then, like a sender's retry, the replay reclaims it with the next fence (another
  compare-and-set: of a replay, a redelivery and the sweeper racing, exactly one wins) and runs
  its handlers in one transaction with the completion;
- a ``failed`` queued receipt (a dead letter) is instead made due again, with a fresh round of
  attempts, for the workers (the ``queue_reopen`` statement, fenced).

External handlers of a ``released`` or ``failed`` receipt run again too: replaying is the
operator's decision, taken after looking at the outside system (which is what
``needs_review`` asks for). An external attempt still in flight (its lease ran out, or its
reconcile failed) is another matter: it may be acting outside right now, or may have acted
before its process died, and nobody has looked. Its replay reconciles it, as the sweeper
would: each external handler's ``reconcile()`` decides, or without one the receipt is held
for review (``failed``, which the operator then replays once they have looked). That holds
for every caller of :func:`replay`: ``receiver replay``, the console, and a bulk replay job
taken over after its runner died. A completed receipt is never replayed: its effects
committed once, and its stored answer is what every redelivery gets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from .._exceptions import ReceiverError
from .._ledger import receipts as ledger
from .._ledger.receipts import Key, Receipt, State
from .._ledger.responses import replay as replay_response
from .._logging import get_logger
from .._ops.metrics import Metrics
from .._queue import receipts as queue
from .._store.base import Store
from .outcomes import Outcome, Reply
from .pipeline import Pipeline
from .providers import Provider

logger = get_logger("receiver")


class Receiver(Protocol):
    """What a replay needs of a :class:`~receiver.Receiver` (named structurally, so that this
    module does not import the app that imports it)."""

    @property
    def providers(self) -> Mapping[str, Provider]: ...
    @property
    def store(self) -> Store: ...
    @property
    def pipeline(self) -> Pipeline: ...
    @property
    def metrics(self) -> Metrics | None: ...
    @property
    def clock(self) -> Callable[[], float]: ...


class ReplayRefused(ReceiverError):
    """This receipt cannot be replayed."""


async def replay(rx: Receiver, provider_name: str, webhook_id: str) -> Reply:
    """Run one stored delivery again; raises :class:`ReplayRefused` with the reason."""
    provider = rx.providers.get(provider_name)
    if provider is None:
        raise ReplayRefused(
            f"no provider named {provider_name!r} in this receiver "
            f"(configured: {', '.join(sorted(rx.providers)) or 'none'})"
        )
    key = Key(provider_name, webhook_id)
    now = rx.store.now()
    async with rx.store.acquire() as conn:
        receipt = _replayable(key, await ledger.lookup(conn, key, now))
        if receipt.state is State.FAILED and await queue.reopen(conn, key, receipt.fence, now):
            # A queued dead letter: due again now, for the workers, with a fresh round of
            # attempts (its sender was answered 202 long ago; nothing is sent back here).
            requeued = Reply(replay_response(queue.QUEUED, replayed=False), Outcome.QUEUED)
            _report(rx, key, receipt, requeued)
            return requeued
        if receipt.state is State.FAILED:
            reopened = await conn.run("reopen", key.provider, key.webhook_id, receipt.fence, now)
            if reopened is None:
                raise ReplayRefused(f"{_name(key)} changed while being reopened: look again")
            receipt = dataclasses.replace(receipt, state=State.RELEASED)
    # In flight means an attempt began and never finished: never run an external one blindly.
    interrupted = receipt.state is State.IN_FLIGHT
    reply = await rx.pipeline.recover(provider, receipt, reconcile=interrupted)
    if reply is None or reply.outcome is Outcome.IN_FLIGHT:
        raise ReplayRefused(
            f"{_name(key)} was taken over by another attempt (a redelivery or the sweeper) "
            "before the replay could claim it"
        )
    _report(rx, key, receipt, reply)
    return reply


def _report(rx: Receiver, key: Key, receipt: Receipt, reply: Reply) -> None:
    logger.info(
        "replay %s",
        reply.outcome.value,
        extra={
            "provider": key.provider,
            "webhook_id": key.webhook_id,
            "event_type": receipt.event_type,
            "outcome": reply.outcome.value,
            "status": reply.response.status_code,
            "fence": reply.fence,
        },
    )
    if rx.metrics is not None:
        rx.metrics.replayed(key.provider, reply.outcome.value)


def _replayable(key: Key, receipt: Receipt | None) -> Receipt:
    if receipt is None:
        raise ReplayRefused(f"no receipt for {_name(key)}: never received, or expired and deleted")
    if receipt.state is State.COMPLETED:
        status = receipt.response.status if receipt.response else "?"
        raise ReplayRefused(
            f"{_name(key)} is completed: its effects committed once and its stored answer "
            f"(HTTP {status}) is replayed to every redelivery; completed receipts are never "
            "run again"
        )
    now = receipt.now
    if receipt.state is State.IN_FLIGHT and receipt.lease_until > now:
        raise ReplayRefused(
            f"{_name(key)} is in flight: the attempt with fence {receipt.fence} holds its lease "
            f"for {receipt.lease_until - now:.0f} s more; replay it after that if it is stuck"
        )
    if receipt.request_body is None:
        raise ReplayRefused(f"{_name(key)} has no stored request body to replay")
    return receipt


async def failed_keys(rx: Receiver, provider: str = "", limit: int = 100) -> list[Key]:
    """The receipts ``receiver failed`` lists (failed, or released after failed attempts),
    oldest first, at most ``limit``."""
    async with rx.store.acquire() as conn:
        rows = await conn.run_all("list_failed", provider, limit)
    return [Key(r["provider"], r["webhook_id"]) for r in rows]


async def replay_all(
    rx: Receiver, keys: list[Key]
) -> AsyncIterator[tuple[Key, Reply | ReplayRefused]]:
    """Replay ``keys`` one after the other, yielding each result (a refusal does not stop the
    batch)."""
    for key in keys:
        try:
            yield key, await replay(rx, key.provider, key.webhook_id)
        except ReplayRefused as exc:
            yield key, exc


def _name(key: Key) -> str:
    return f"{key.provider}/{key.webhook_id}"
