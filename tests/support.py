"""Small real pieces shared by the tests: a clock, signed deliveries, and a test app whose
handler writes a business row through ``tx`` and counts its own invocations."""

from __future__ import annotations

import collections
import re
import sqlite3
import time
from typing import Any, TypeVar

import asyncpg
import orjson
from starlette.responses import Response

from receiver import Event, Provider, Receiver, Store, sign
from receiver._store.base import Connection

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PROVIDER = "acme"
T0 = 1_800_000_000.0
S = TypeVar("S", bound=Store)

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS effects ("
    " provider TEXT NOT NULL, webhook_id TEXT NOT NULL, fence INTEGER NOT NULL, note TEXT)"
)


#: The reason a test of row-by-row expiry is not run on the partitioned layout (the
#: ``single_layout`` marker): there expiry drops a partition at a time, a span later.
ROW_EXPIRY = (
    "expired receipts are deleted one by one here; the partitioned layout drops a partition "
    "at a time (tests/integration/test_partitions.py)"
)


class Clock:
    """An injectable clock the tests move by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ledger_clock(store: S, clock: Clock) -> S:
    """Give ``store`` the tests' clock as its ledger clock (instead of the database's), so
    that moving the clock moves leases and expiry too."""
    store.clock = clock
    return store


def body_of(event_type: str = "order.created", **data: Any) -> bytes:
    return orjson.dumps({"type": event_type, "data": data})


def signed(
    webhook_id: str,
    body: bytes,
    *,
    timestamp: float | None = None,
    secret: str = SECRET,
) -> dict[str, str]:
    ts = int(time.time() if timestamp is None else timestamp)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(secret, webhook_id, ts, body),
        "content-type": "application/json",
    }


class SimulatedCrash(BaseException):
    """Raised by the test handler to model a process dying mid-handler: a BaseException, so
    nothing in the pipeline catches it; the open transaction rolls back (as the database does
    when a connection drops) and no release happens, leaving the claim in flight."""


class Recorder:
    """Counts handler invocations (committed or not) per webhook-id, and makes chosen
    deliveries fail after their write, so that the write must roll back."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()
        self.crashes: set[str] = set()

    def fail_next(self, webhook_id: str, times: int = 1) -> None:
        self.failures[webhook_id] += times

    def should_fail(self, webhook_id: str) -> bool:
        if self.failures[webhook_id] > 0:
            self.failures[webhook_id] -= 1
            return True
        return False

    def crash_next(self, webhook_id: str) -> None:
        self.crashes.add(webhook_id)

    def __call__(self, event: Event) -> None:
        self.calls[event.id] += 1


def make_receiver(
    store: Store, *, clock: Clock | None = None, lease: float = 60.0, **options: Any
) -> tuple[Receiver, Recorder]:
    """A receiver whose ``order.*`` handler writes one ``effects`` row, then behaves as the
    payload's ``data.mode`` says: ``ok``, ``raise``, ``status`` (return ``data.status``).

    A ``clock`` drives the ledger too (the store's clock, unless the store has one already),
    so that tests move leases and expiry by hand."""
    if clock is not None and store.clock is None:
        store.clock = clock
    rx = Receiver(
        store,
        [Provider(PROVIDER, [SECRET], lease=lease)],
        clock=clock or time.time,
        **options,
    )
    recorder = Recorder()

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> Any:
        recorder(event)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        if event.id in recorder.crashes:
            recorder.crashes.discard(event.id)
            raise SimulatedCrash(event.id)
        data = event.payload.get("data") or {}
        mode = data.get("mode", "ok")
        if mode == "raise" or recorder.should_fail(event.id):
            raise RuntimeError("the handler failed on purpose")
        if mode == "status":
            return Response(
                orjson.dumps({"answer": data.get("status")}),
                int(data["status"]),
                media_type="application/json",
            )
        return {"order": data.get("order"), "fence": event.fence, "seen": event.type}

    return rx, recorder


async def write_effect(tx: Connection, provider: str, key: str, fence: int) -> None:
    """The business row a handler (or a keyed endpoint) writes in the ledger's transaction."""
    await tx.execute(
        "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
        provider,
        key,
        fence,
    )


async def effects(store: Store, webhook_id: str | None = None) -> int:
    """Committed business rows (all, or of one webhook-id)."""
    async with store.acquire() as conn:
        if webhook_id is None:
            return int(await conn.fetchval("SELECT count(*) FROM effects"))
        return int(
            await conn.fetchval("SELECT count(*) FROM effects WHERE webhook_id = $1", webhook_id)
        )


async def receipt_count(store: Store) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM receiver_receipts"))


async def query(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows from the store, read directly (``$n`` placeholders on both dialects)."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=10)
        try:
            return [tuple(r) for r in db.execute(re.sub(r"\$(\d+)", r"?\1", sql), args)]
        finally:
            db.close()
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()
