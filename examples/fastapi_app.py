"""The receiver mounted in a FastAPI app, sharing the app's lifespan and its asyncpg pool.

    export RECEIVER_SECRET=whsec_... DATABASE_URL=postgresql://app@db/app
    uvicorn examples.fastapi_app:app        # POST /webhooks/billing, GET /invoices/{id}

One pool, opened in the app's lifespan, serves the app's own endpoints and the receiver's
ledger, and so the handlers' ``tx``: a handler's writes and the receipt commit on one of the
app's connections. An asyncpg pool belongs to the event loop it was created on, so it cannot be
made at import time; the lifespan builds the receiver around it, and both travel in the lifespan
state (``request.state.pool``, and the ``/webhooks`` mount below).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from fastapi import FastAPI, HTTPException, Request
from starlette.types import Receive, Scope, Send

from receiver import Connection, Event, PostgresStore, Provider, Receiver

DATABASE_URL = os.environ["DATABASE_URL"]
SECRETS = os.environ["RECEIVER_SECRET"].split(",")


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


def build_receiver(pool: asyncpg.Pool) -> Receiver:
    rx = Receiver(
        PostgresStore(pool=pool),  # borrows the pool: never opens or closes one of its own
        [Provider("billing", SECRETS, schedule="svix")],
        trusted_proxies=os.environ.get("RECEIVER_TRUSTED_PROXIES", ""),
    )
    rx.add_handler("invoice.paid", invoice_paid)
    return rx


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    async with asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=10) as pool:
        rx = build_receiver(pool)
        await rx.store.migrate()  # idempotent, serialised across replicas
        async with pool.acquire() as conn, conn.transaction():
            # Workers start together, and concurrent CREATE TABLE IF NOT EXISTS can collide.
            await conn.execute("SELECT pg_advisory_xact_lock(8623001)")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS paid_invoices ("
                " id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, client TEXT)"
            )
        async with rx.lifespan(app):  # opens the receiver and runs its sweeper
            yield {"pool": pool, "receiver": rx}


app = FastAPI(lifespan=lifespan)


@app.get("/invoices/{invoice_id}")
async def invoice(invoice_id: str, request: Request) -> dict[str, Any]:
    row = await request.state.pool.fetchrow(
        "SELECT id, webhook_id, client FROM paid_invoices WHERE id = $1", invoice_id
    )
    if row is None:
        raise HTTPException(404, "no such paid invoice")
    return dict(row)


async def webhooks(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /webhooks/{provider}: the receiver the lifespan built around the app's pool."""
    await scope["state"]["receiver"](scope, receive, send)


app.mount("/webhooks", webhooks)
