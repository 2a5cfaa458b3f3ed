"""The application the bulk replay tests replay with, in-process or served by a real
``receiver console --app tests.console.bulkapp:rx`` (its store from RECEIVER_BULK_STORE): an
order handler that records each run in the handlers' transaction (so a run counts only if it
committed with its receipt) and fails while the ``bulk_switch`` row says the inventory service
is down, a helper that seeds many failed deliveries at once, and one that resends a stored
delivery as its sender retries it."""

from __future__ import annotations

import os
from typing import Any

from receiver import Backoff, Connection, Event, Provider, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Claimed, Key
from receiver._verification.payload import parse
from receiver.testing import Sender, Webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TABLES = (
    "CREATE TABLE IF NOT EXISTS bulk_runs (webhook_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bulk_switch (broken INTEGER NOT NULL)",
)


def make(store: Store | str) -> Receiver:
    rx = Receiver(
        store=store,
        providers=[
            # A short lease: an attempt killed with its process is taken over within seconds.
            Provider("shop", secrets=[SECRET], lease=2.0),
            Provider("billing", secrets=[SECRET], lease=2.0),
            Provider("jobs", secrets=[SECRET], mode="queued", retry=Backoff(attempts=1)),
        ],
        sweep_interval=None,
    )

    async def order(event: Event, tx: Connection) -> dict[str, Any]:
        await tx.execute("INSERT INTO bulk_runs (webhook_id) VALUES ($1)", event.id)
        if await tx.fetchval("SELECT count(*) FROM bulk_switch WHERE broken = 1"):
            raise RuntimeError("inventory service timed out")
        return {"order": event.id}

    rx.add_handler("order.*", order)  # every provider's
    return rx


async def prepare(store: Store) -> None:
    """The handler's tables, empty."""
    async with store.acquire() as conn:
        for statement in TABLES:
            await conn.execute(statement)
        await conn.execute("DELETE FROM bulk_runs")
        await conn.execute("DELETE FROM bulk_switch")


async def broken(store: Store, yes: bool) -> None:
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM bulk_switch")
        if yes:
            await conn.execute("INSERT INTO bulk_switch (broken) VALUES (1)")


async def fail_many(rx: Receiver, provider: str, ids: list[str], error: str = "") -> None:
    """Receipts as a failed delivery leaves them (released, the body kept, the attempt's error
    recorded), written through the ledger's own functions in one transaction: thousands in a
    moment, where sending each through a failing handler would take seconds."""
    store = rx.store
    async with Sender(rx, provider, SECRET) as sender, store.acquire() as conn, conn.transaction():
        for webhook_id in ids:
            webhook = sender.event("order.created", {"id": webhook_id}, id=webhook_id)
            digest = parse(webhook.body, "order.created").payload_hash
            key = Key(provider, webhook_id)
            got = await ledger.claim(
                conn,
                Claim(key, digest, "order.created", webhook.body, store.now(), 60, 86400),
            )
            assert isinstance(got, Claimed)
            why = error or "RuntimeError: inventory service timed out"
            assert await ledger.release(conn, key, got.fence, why, store.now())


async def resend(rx: Receiver, provider: str, webhook_id: str) -> int | None:
    """The sender's own retry of a stored delivery (the same body bytes, signed anew): its
    status."""
    async with rx.store.acquire() as conn:
        found = await ledger.lookup(conn, Key(provider, webhook_id))
    assert found is not None
    assert found.request_body is not None
    webhook = Webhook(provider, webhook_id, found.event_type or "", found.request_body)
    async with Sender(rx, provider, SECRET) as sender:
        return (await sender.send(webhook)).status


async def runs(store: Store) -> dict[str, int]:
    async with store.acquire() as conn:
        rows = await conn.fetch(
            "SELECT webhook_id, count(*) AS n FROM bulk_runs GROUP BY webhook_id"
        )
    return {r["webhook_id"]: int(r["n"]) for r in rows}


rx = make(os.environ.get("RECEIVER_BULK_STORE", "sqlite:///bulk-test.db"))
