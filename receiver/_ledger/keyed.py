"""Keys that are not webhook-ids, on the same ledger: agent actions and Idempotency-Key requests.

The action executor (:mod:`receiver._actions.executor`) and the Idempotency-Key middleware
(:mod:`receiver._idempotency.middleware`) store their keys as receipts in
``receiver_receipts``: the same
claim (one ``INSERT ... ON CONFLICT DO NOTHING``), the same fences and leases, the same sweeper.
Their ``provider`` column is a namespace with a colon (``action:refund``, ``idem:api``), which
no webhook provider name can contain, so the two never collide with deliveries.

This module is the few calls both make, and the bounded wait of a duplicate for the attempt
that holds its key: in-process duplicates are woken the moment that attempt ends, others poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from .._store.base import Connection, Store
from . import receipts as ledger
from .receipts import Claim, Claimed, Key, Receipt, State, StoredResponse

ACTION = "action"
IDEMPOTENCY = "idem"


def namespace(provider: str) -> str | None:
    """``"action"`` for ``"action:refund"``; None for a webhook provider (no colon)."""
    head, colon, _ = provider.partition(":")
    return head if colon else None


async def claim(store: Store, c: Claim) -> Claimed | Receipt:
    async with store.acquire() as conn:
        return await ledger.claim(conn, c)


async def reclaim(store: Store, c: Claim, seen_fence: int) -> int | None:
    async with store.acquire() as conn:
        return await ledger.reclaim(conn, c, seen_fence)


async def lookup(store: Store, key: Key) -> Receipt | None:
    async with store.acquire() as conn:
        return await ledger.lookup(conn, key, store.now())


async def complete(
    store: Store,
    conn: Connection | None,
    key: Key,
    fence: int,
    answer: StoredResponse,
    state: State = State.COMPLETED,
) -> None:
    """Fenced completion: on ``conn`` (inside the caller's transaction) or on a connection of
    its own. Raises LeaseLost if a newer attempt owns the key."""
    if conn is not None:
        await ledger.complete(conn, key, fence, answer, store.now(), state=state)
        return
    async with store.acquire() as own:
        await ledger.complete(own, key, fence, answer, store.now(), state=state)


async def release(store: Store, key: Key, fence: int, error: str) -> bool:
    """Give the key back after a failed attempt (fenced); the error is kept for people."""
    message = error.replace("\x00", "\\x00")[:2000]  # PostgreSQL text cannot hold NUL
    async with store.acquire() as conn:
        return await ledger.release(conn, key, fence, message, store.now())


async def forget(store: Store, key: Key, fence: int) -> bool:
    """Delete the key of an attempt that did nothing (fenced), so that the next request under
    it is a new one: for a request refused before the endpoint ran."""
    async with store.acquire() as conn:
        return await ledger.forget(conn, key, fence)


async def unresolved(store: Store, key: Key, fence: int, error: str) -> bool:
    """Keep an interrupted external attempt in flight with its lease ended (reconcile failed)."""
    message = error.replace("\x00", "\\x00")[:2000]
    async with store.acquire() as conn:
        return await ledger.unresolved(conn, key, fence, message, store.now())


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt of a key: its fence, when (epoch seconds), and its redacted error."""

    fence: int
    failed_at: float
    error: str


@dataclass(frozen=True, slots=True)
class KeyState:
    """What the ledger holds for an action's or an Idempotency-Key request's key, read without
    acting on it (no claim, no recovery): `Actions.inspect` and the middleware's
    ``inspect``.

    ``state`` is ``in_flight``, ``completed``, ``failed`` or ``released``; ``needs_review`` is
    True for a failed key that a person must look at; ``result`` is the stored answer's bytes
    (a tool's result, an endpoint's body, or the stored failure) and ``status`` its status.
    """

    namespace: str
    key: str
    state: State
    fence: int
    needs_review: bool
    claimed_at: float
    lease_until: float
    expires_at: float
    completed_at: float | None
    status: int | None
    result: bytes | None
    last_error: str | None
    attempts: tuple[FailedAttempt, ...]


async def inspect(store: Store, key: Key) -> KeyState | None:
    """The key's state, its attempts (errors redacted when they were stored) and its stored
    answer; None if the ledger has no such key (never claimed, or expired and deleted)."""
    async with store.acquire() as conn:
        receipt = await ledger.lookup(conn, key, store.now())
        if receipt is None:
            return None
        rows = await conn.run_all("list_attempts", key.provider, key.webhook_id)
    response = receipt.response
    return KeyState(
        namespace=key.provider,
        key=key.webhook_id,
        state=receipt.state,
        fence=receipt.fence,
        needs_review=needs_review(receipt),
        claimed_at=receipt.claimed_at,
        lease_until=receipt.lease_until,
        expires_at=receipt.expires_at,
        completed_at=receipt.completed_at,
        status=None if response is None else response.status,
        result=None if response is None else response.body,
        last_error=receipt.last_error,
        attempts=tuple(
            FailedAttempt(int(r["fence"]), float(r["failed_at"]), str(r["error"])) for r in rows
        ),
    )


def needs_review(receipt: Receipt) -> bool:
    """A failed receipt whose stored answer says a person must look."""
    response = receipt.response
    return (
        receipt.state is State.FAILED
        and response is not None
        and b'"needs_review"' in response.body[:200]
    )


class Waiters:
    """Attempts running in this process, so that a duplicate waits for the end of the one that
    holds its key instead of polling the store."""

    def __init__(self) -> None:
        self._running: dict[Key, asyncio.Event] = {}

    @contextlib.contextmanager
    def running(self, key: Key) -> Iterator[None]:
        done = asyncio.Event()
        self._running[key] = done
        try:
            yield
        finally:
            done.set()
            if self._running.get(key) is done:
                del self._running[key]

    async def wait(self, store: Store, key: Key, seconds: float) -> Receipt | None:
        """Wait up to ``seconds`` for the attempt holding ``key`` to end; the receipt
        as last read (still in flight if the wait ran out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        pause = 0.005
        while True:
            local = self._running.get(key)
            left = deadline - loop.time()
            if local is not None and left > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await local.wait()
            receipt = await lookup(store, key)
            if receipt is None or not live(receipt) or loop.time() >= deadline:
                return receipt
            # Held by another process: poll, backing off, never past the deadline.
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, 0.1)


def live(receipt: Receipt) -> bool:
    return receipt.state is State.IN_FLIGHT and receipt.lease_until > receipt.now
