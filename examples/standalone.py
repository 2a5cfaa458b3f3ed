"""The receiver alone, served by several uvicorn workers (the replicas behind Kong).

    export RECEIVER_SECRET=whsec_... RECEIVER_STORE=postgresql://app@db/app
    export RECEIVER_TRUSTED_PROXIES=10.0.0.0/24     # where Kong connects from
    receiver migrate --store "$RECEIVER_STORE"
    uvicorn examples.standalone:app --host 0.0.0.0 --port 8000 --workers 2 \\
        --no-proxy-headers --timeout-keep-alive 75

Every worker process imports this module and builds its own Receiver and pool; the ledger's
unique constraint (one PostgreSQL, or one SQLite file on one host) decides between them, so a
delivery and its duplicates execute once whichever worker or replica they reach.

The receiver is served under /webhooks, the path Kong's route keeps (examples/kong/kong.yml):
POST /webhooks/billing. ``--no-proxy-headers`` leaves X-Forwarded-For to the receiver's
``trusted_proxies`` (uvicorn would otherwise rewrite the peer itself for 127.0.0.1), and a
keep-alive timeout above Kong's 60 s upstream idle timeout keeps Kong from reusing a connection
uvicorn has just closed (a POST is not retried on it: the sender would see a 502).
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.routing import Mount

from receiver import Connection, Event, Provider, Receiver

rx = Receiver(
    os.environ.get("RECEIVER_STORE", "sqlite:///standalone.db"),
    [Provider("billing", os.environ["RECEIVER_SECRET"].split(","), schedule="svix")],
    trusted_proxies=os.environ.get("RECEIVER_TRUSTED_PROXIES", ""),
)


@rx.on_startup
async def create_tables(conn: Connection) -> None:
    async with conn.transaction():
        if conn.dialect == "postgresql":
            # All workers start at once, and two concurrent CREATE TABLE IF NOT EXISTS can still
            # collide on PostgreSQL's catalog: take turns.
            await conn.execute("SELECT pg_advisory_xact_lock(8623001)")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS paid_invoices ("
            " id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, client TEXT)"
        )


@rx.on("invoice.paid")
async def invoice_paid(event: Event, tx: Connection) -> dict[str, str]:
    invoice = str(event.payload.get("data", {}).get("id", "unknown"))
    await tx.execute(
        "INSERT INTO paid_invoices (id, webhook_id, client) VALUES ($1, $2, $3)"
        " ON CONFLICT (id) DO NOTHING",
        invoice,
        event.id,
        event.client,
    )
    return {"invoice": invoice, "status": "paid"}


app = Starlette(routes=[Mount("/webhooks", rx)], lifespan=rx.lifespan)
