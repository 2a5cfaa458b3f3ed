"""The app that ``receiver serve`` runs by default: a small order book kept by webhooks.

A sender (provider ``demo``) reports orders being created, paid and cancelled. Each handler
writes through ``tx``, so the business rows commit together with the receipt: a redelivered
``order.created`` never inserts a second order, and a crash mid-handler leaves nothing behind.

Configuration comes from the environment (``receiver serve`` sets it from its options):
``RECEIVER_STORE`` (default ``sqlite:///receiver.db``) and ``RECEIVER_SECRET`` (one or more
comma-separated ``whsec_``/``whpk_`` secrets of the ``demo`` provider).
"""

from __future__ import annotations

import os
from typing import Any

from starlette.responses import JSONResponse

from receiver import ConfigurationError, Connection, Event, Provider, Receiver

STORE = os.environ.get("RECEIVER_STORE", "sqlite:///receiver.db")
_secrets = [s.strip() for s in os.environ.get("RECEIVER_SECRET", "").split(",") if s.strip()]
if not _secrets:
    raise ConfigurationError(
        "the demo app needs RECEIVER_SECRET (a whsec_... secret); `receiver serve` generates "
        "one for you and prints it"
    )

rx = Receiver(STORE, [Provider("demo", _secrets, schedule="svix")])
app = rx

ORDERS_DDL = """
CREATE TABLE IF NOT EXISTS orders (
    id           TEXT PRIMARY KEY,
    customer     TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    status       TEXT NOT NULL,
    updated_by   TEXT NOT NULL
)
"""


@rx.on_startup
async def create_tables(conn: Connection) -> None:
    await conn.execute(ORDERS_DDL)


def _order(event: Event) -> dict[str, Any]:
    data = event.payload.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("order_id"), str):
        raise _BadEvent("the event needs data.order_id (a string)")
    return data


class _BadEvent(Exception):
    pass


@rx.on("order.created")
async def order_created(event: Event, tx: Connection) -> Any:
    try:
        data = _order(event)
        amount = int(data.get("amount_cents", 0))
    except (_BadEvent, TypeError, ValueError) as exc:
        return JSONResponse({"error": str(exc)}, status_code=422)
    existing = await tx.fetchval("SELECT status FROM orders WHERE id = $1", data["order_id"])
    if existing is not None:
        # A different webhook-id for an order we already have: the sender made a new event
        # for the same business object. Absolute writes make this harmless; say so.
        return {"order_id": data["order_id"], "status": existing, "note": "already known"}
    await tx.execute(
        "INSERT INTO orders (id, customer, amount_cents, status, updated_by)"
        " VALUES ($1, $2, $3, 'created', $4)",
        data["order_id"],
        str(data.get("customer", "unknown")),
        amount,
        event.id,
    )
    return {"order_id": data["order_id"], "status": "created"}


async def _set_status(event: Event, tx: Connection, status: str) -> Any:
    try:
        data = _order(event)
    except _BadEvent as exc:
        return JSONResponse({"error": str(exc)}, status_code=422)
    found = await tx.fetchval("SELECT id FROM orders WHERE id = $1", data["order_id"])
    if found is None:
        # Final, not retryable: retrying will not make the order exist.
        return JSONResponse({"error": f"unknown order {data['order_id']}"}, status_code=422)
    await tx.execute(
        "UPDATE orders SET status = $1, updated_by = $2 WHERE id = $3",
        status,
        event.id,
        data["order_id"],
    )
    return {"order_id": data["order_id"], "status": status}


@rx.on("order.paid")
async def order_paid(event: Event, tx: Connection) -> Any:
    return await _set_status(event, tx, "paid")


@rx.on("order.cancelled")
async def order_cancelled(event: Event, tx: Connection) -> Any:
    return await _set_status(event, tx, "cancelled")
