"""The receipt ledger: claim a key once, complete or release it under its fence.

Every operation here is a single statement whose outcome is decided by the database: the
primary key decides who claims, the ``fence`` column decides whose completion counts. There is
no check-then-act anywhere; :func:`decide` only interprets a row the database already chose.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .._exceptions import LeaseLost
from .._store.base import Connection, Row


class State(enum.StrEnum):
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    FAILED = "failed"
    RELEASED = "released"
    QUEUED = "queued"  # queued mode: waiting for a worker (receiver/_queue/receipts.py)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """An answer as it is stored and replayed: byte for byte.

    ``content_type`` is empty when the handler's response had none (it is then replayed
    without one); ``headers`` are the handler's other headers (Retry-After, Location, its own),
    in order, replayed with it.
    """

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def encode_headers(headers: tuple[tuple[str, str], ...]) -> bytes | None:
    """Stored as a JSON list of [name, value] pairs (order and repeats kept); None if empty."""
    return orjson.dumps(headers) if headers else None


def decode_headers(raw: bytes | None) -> tuple[tuple[str, str], ...]:
    if not raw:
        return ()
    return tuple((str(name), str(value)) for name, value in orjson.loads(bytes(raw)))


@dataclass(frozen=True, slots=True)
class Key:
    provider: str
    webhook_id: str


@dataclass(frozen=True, slots=True)
class Receipt:
    """A row of the ledger, and the ledger's time when it was read (``now``: the database's
    clock, or the store's injected one), against which its lease and expiry are judged."""

    key: Key
    now: float
    state: State
    fence: int
    payload_hash: bytes
    event_type: str | None
    claimed_at: float
    lease_until: float
    expires_at: float
    completed_at: float | None
    response: StoredResponse | None
    request_body: bytes | None
    attempts: int
    last_error: str | None

    @classmethod
    def from_row(cls, key: Key, row: Row) -> Receipt:
        status = row["response_status"]
        response = (
            None
            if status is None
            else StoredResponse(
                status,
                row["response_content_type"] or "",
                bytes(row["response_body"]),
                decode_headers(row["response_headers"]),
            )
        )
        body = row["request_body"]
        return cls(
            key=key,
            now=row["now"],
            state=State(row["state"]),
            fence=row["fence"],
            payload_hash=bytes(row["payload_hash"]),
            event_type=row["event_type"],
            claimed_at=row["claimed_at"],
            lease_until=row["lease_until"],
            expires_at=row["expires_at"],
            completed_at=row["completed_at"],
            response=response,
            request_body=None if body is None else bytes(body),
            attempts=row["attempts"],
            last_error=row["last_error"],
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """What a delivery asks the ledger for. ``lease`` and ``window`` are durations in seconds,
    counted from the ledger's time at the claim; ``now`` is that time when the store has an
    injected clock (tests), None for the database's own."""

    key: Key
    payload_hash: bytes
    event_type: str | None
    body: bytes
    now: float | None
    lease: float
    window: float


class Decision(enum.Enum):
    """What to do with a delivery whose key was already in the ledger."""

    REPLAY = "replay"  # completed or failed, same payload: send the stored answer again
    MISMATCH = "mismatch"  # same id, different payload: 422, never run
    IN_FLIGHT = "in_flight"  # another attempt holds a live lease: 409
    RECOVER = "recover"  # in flight but the lease expired: the attempt died or stalled
    RECLAIM = "reclaim"  # released after a failure, or expired: run again with the next fence


def decide(receipt: Receipt, payload_hash: bytes) -> Decision:
    """Judged by the ledger's clock as the row was read. A live lease wins over everything, even
    expiry: an attempt that is still running is never taken over."""
    now = receipt.now
    if receipt.state is State.QUEUED or (
        receipt.state is State.IN_FLIGHT and receipt.response is not None
    ):
        # An unfinished queued delivery (only a queued one is in flight with a stored answer):
        # its 202 was stored at ingest and is the answer whatever the workers are doing.
        return Decision.MISMATCH if receipt.payload_hash != payload_hash else Decision.REPLAY
    if receipt.state is State.IN_FLIGHT and receipt.lease_until > now:
        if receipt.expires_at > now and receipt.payload_hash != payload_hash:
            return Decision.MISMATCH
        return Decision.IN_FLIGHT
    if receipt.state is State.IN_FLIGHT and receipt.expires_at <= now:
        # Unfinished, past its window too (a task resumed a week later): its attempt died, and
        # whether it acted is unknown whatever its age. Recovered (reconcile() for external
        # effects), never reclaimed blindly; only finished or released receipts expire.
        return Decision.RECOVER
    if receipt.expires_at <= now:
        return Decision.RECLAIM
    if receipt.payload_hash != payload_hash:
        return Decision.MISMATCH
    if receipt.state in (State.COMPLETED, State.FAILED):
        return Decision.REPLAY
    if receipt.state is State.RELEASED:
        return Decision.RECLAIM
    return Decision.RECOVER


@dataclass(frozen=True, slots=True)
class Claimed:
    """The caller owns the key now, with fence 1, claimed at the ledger's time ``now``."""

    fence: int
    now: float
    #: The same payload is already in the window under another webhook-id (key drift).
    drift: bool


async def claim(conn: Connection, c: Claim) -> Claimed | Receipt:
    """Claim ``c.key``: :class:`Claimed` if this caller owns it now, else the existing receipt.

    A row can disappear between the insert and the lookup (the sweeper deleted it because it
    expired); the insert is then simply tried again.
    """
    k = c.key
    for _ in range(3):
        row = await conn.run("claim", *_claim_args(c, c.now))
        if row is not None and row["claimed"]:
            return _claimed(row)
        if row is not None:  # PostgreSQL returns the existing receipt in the same statement
            return Receipt.from_row(k, row)
        existing = await lookup(conn, k, c.now)
        if existing is not None:
            return existing
    raise LeaseLost(f"receipt {k.webhook_id!r} kept vanishing while being claimed")


def _claimed(row: Row) -> Claimed:
    return Claimed(int(row["fence"]), row["now"], bool(row["drift"]))


def _claim_args(c: Claim, now: float | None) -> tuple[Any, ...]:
    return (
        c.key.provider,
        c.key.webhook_id,
        c.payload_hash,
        c.event_type,
        now,
        c.lease,
        c.window,
        c.body,
    )


async def reclaim(conn: Connection, c: Claim, seen_fence: int) -> int | None:
    """Take over a released, lease-expired or expired receipt; None if another caller did."""
    k = c.key
    row = await conn.run(
        "reclaim",
        k.provider,
        k.webhook_id,
        seen_fence,
        c.payload_hash,
        c.event_type,
        c.now,
        c.lease,
        c.window,
        c.body,
    )
    return None if row is None else int(row["fence"])


async def lookup(conn: Connection, key: Key, now: float | None = None) -> Receipt | None:
    row = await conn.run("lookup", key.provider, key.webhook_id, now)
    return None if row is None else Receipt.from_row(key, row)


async def complete(
    conn: Connection,
    key: Key,
    fence: int,
    response: StoredResponse,
    now: float | None,
    *,
    state: State = State.COMPLETED,
) -> None:
    """Store the final answer under ``fence``; raises LeaseLost if a newer claim owns the key,
    so that the caller's transaction (and its handlers' writes) roll back."""
    row = await conn.run(
        "complete",
        key.provider,
        key.webhook_id,
        fence,
        state.value,
        response.status,
        response.content_type,
        response.body,
        now,
        encode_headers(response.headers),
    )
    if row is None:
        raise LeaseLost(f"fence {fence} of {key.provider}/{key.webhook_id} is stale")


async def release(conn: Connection, key: Key, fence: int, error: str, now: float | None) -> bool:
    """Give the key back after a failed attempt and keep the error; False if the fence is stale."""
    return await _failed_attempt(conn, "release", key, fence, error, now)


async def unresolved(conn: Connection, key: Key, fence: int, error: str, now: float | None) -> bool:
    """An interrupted external attempt could not be reconciled: keep it in flight with its
    lease ended (never released) and keep the error; False if the fence is stale."""
    return await _failed_attempt(conn, "unresolve", key, fence, error, now)


async def forget(conn: Connection, key: Key, fence: int) -> bool:
    """Delete the key of an attempt that did nothing, with its attempts (fenced): the next
    request under it is a new one. False if the fence is stale."""
    async with conn.transaction():
        if await conn.run("forget", key.provider, key.webhook_id, fence) is None:
            return False
        await conn.run_all("forget_attempts", key.provider, key.webhook_id)
        return True


async def _failed_attempt(
    conn: Connection, statement: str, key: Key, fence: int, error: str, now: float | None
) -> bool:
    """The fenced ``statement`` and the attempt's row, together or not at all."""
    async with conn.transaction():
        row = await conn.run(statement, key.provider, key.webhook_id, fence, error, now)
        if row is None:
            return False
        await conn.run("record_attempt", key.provider, key.webhook_id, fence, now, error)
        return True


async def extend_lease(
    conn: Connection, key: Key, fence: int, now: float | None, seconds: float
) -> None:
    """The lease now runs ``seconds`` from the ledger's time; LeaseLost if the fence is stale."""
    row = await conn.run("extend_lease", key.provider, key.webhook_id, fence, now, seconds)
    if row is None:
        raise LeaseLost(f"fence {fence} of {key.provider}/{key.webhook_id} is stale")


async def claim_many(
    conn: Connection, claims: Sequence[Claim], now: float | None
) -> list[Claimed | Receipt | None]:
    """Claim many keys at one time ``now`` (the micro-batcher's flush). One result per claim,
    in order; None where the caller must look the key up (another claim of the same batch won
    it, or a concurrent one committed after the statement's snapshot).

    PostgreSQL: one statement, one round trip. SQLite: the keyed claim per key, all in one call
    to its thread, in the group's transaction (one COMMIT, one fsync, for the whole group);
    then a lookup of each key that was already there."""
    if conn.dialect != "postgresql":
        async with conn.transaction():
            rows = await conn.run_many("claim", [_claim_args(c, now) for c in claims])
            won = {(r["provider"], r["webhook_id"]): r for r in rows}
            claimed: list[Claimed | Receipt | None] = []
            for c in claims:
                row = won.pop((c.key.provider, c.key.webhook_id), None)
                if row is None:  # already there (or won by an earlier copy in this batch)
                    claimed.append(await lookup(conn, c.key, now))
                else:
                    claimed.append(_claimed(row))
            return claimed
    rows = await conn.run_all(
        "claim_many",
        now,
        [c.key.provider for c in claims],
        [c.key.webhook_id for c in claims],
        [c.payload_hash for c in claims],
        [c.event_type for c in claims],
        [c.lease for c in claims],
        [c.window for c in claims],
        [c.body for c in claims],
    )
    results: list[Claimed | Receipt | None] = []
    for asked, row in zip(claims, rows, strict=True):
        if row["claimed"]:
            results.append(_claimed(row))
        elif row["state"] is None:
            results.append(None)
        else:
            results.append(Receipt.from_row(asked.key, row))
    return results


@dataclass(frozen=True, slots=True)
class Completion:
    """One fenced completion for :func:`complete_many`."""

    key: Key
    fence: int
    response: StoredResponse
    state: State = State.COMPLETED


async def complete_many(
    conn: Connection, completions: Sequence[Completion], now: float | None
) -> list[bool]:
    """Complete many receipts at once; per completion, False if its fence was stale (the
    caller raises LeaseLost for it, as :func:`complete` would). Each is the keyed ``complete``
    statement: PostgreSQL pipelines them in one round trip, atomically; SQLite runs them in one
    transaction (one COMMIT)."""
    args = [
        (
            c.key.provider,
            c.key.webhook_id,
            c.fence,
            c.state.value,
            c.response.status,
            c.response.content_type,
            c.response.body,
            now,
            encode_headers(c.response.headers),
        )
        for c in completions
    ]
    if conn.dialect == "postgresql":
        rows = await conn.run_many("complete", args)
    else:
        async with conn.transaction():
            rows = await conn.run_many("complete", args)
    done = {(r["provider"], r["webhook_id"], r["fence"]) for r in rows}
    return [(c.key.provider, c.key.webhook_id, c.fence) in done for c in completions]
