"""The receiver mounted under /webhooks in an existing Starlette app.

    RECEIVER_SECRET=whsec_... uvicorn examples.mounted:app

The host app's lifespan opens the receiver's store and runs its sweeper.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from receiver import Connection, Event, Provider, Receiver

rx = Receiver(
    os.environ.get("RECEIVER_STORE", "sqlite:///examples.db"),
    [Provider("billing", os.environ["RECEIVER_SECRET"].split(","), schedule="svix")],
)


@rx.on("invoice.paid")
async def invoice_paid(event: Event, tx: Connection) -> dict[str, str]:
    await tx.execute(
        "CREATE TABLE IF NOT EXISTS paid_invoices (id TEXT PRIMARY KEY, webhook_id TEXT)"
    )
    invoice = str(event.payload.get("data", {}).get("id", "unknown"))
    await tx.execute(
        "INSERT INTO paid_invoices (id, webhook_id) VALUES ($1, $2)", invoice, event.id
    )
    return {"invoice": invoice, "status": "paid"}


async def home(request: Request) -> JSONResponse:
    return JSONResponse({"app": "host", "webhooks": "/webhooks/billing"})


app = Starlette(routes=[Route("/", home), Mount("/webhooks", rx)], lifespan=rx.lifespan)
