"""The app that ``receiver serve`` runs by default: a small order book kept by webhooks.

A sender (provider ``demo``) reports orders being created, paid and cancelled. Each handler
writes through ``tx``, so the business rows commit together with the receipt: a redelivered
``order.created`` never inserts a second order, and a crash mid-handler leaves nothing behind.

Configuration comes from the environment (``receiver serve`` sets it from its options):
``RECEIVER_STORE`` (default ``sqlite:///receiver.db``), ``RECEIVER_SECRET`` (one or more
comma-separated ``whsec_``/``whpk_`` secrets of the ``demo`` provider) and
``RECEIVER_TRUSTED_PROXIES`` (comma-separated addresses or networks of your gateways).

With ``receiver serve --config`` the file builds the Receiver instead, and
``handlers = ["handlers"]`` in it calls :func:`register` on that Receiver (see
``examples/receiver.toml``): the demo app below is then never built, and needs no
``RECEIVER_SECRET``.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.responses import JSONResponse

from receiver import ConfigurationError, Connection, Event, Provider, Receiver

ORDERS_DDL = """
CREATE TABLE IF NOT EXISTS orders (
    id           TEXT PRIMARY KEY,
    customer     TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    status       TEXT NOT NULL,
    updated_by   TEXT NOT NULL
)
"""


async def create_tables(conn: Connection) -> None:
    await conn.execute(ORDERS_DDL)


#: The largest amount the orders table holds (``INTEGER`` is 32 bits on PostgreSQL).
MAX_CENTS = 2**31 - 1
#: The longest order id and customer name taken.
MAX_TEXT = 200


class _BadEvent(Exception):
    pass


def _text(data: dict[str, Any], name: str, default: str | None = None) -> str:
    """A string field of ``data``: what a database's text column holds (PostgreSQL's cannot
    hold NUL), of a sane length."""
    value = data.get(name, default)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TEXT or "\x00" in value:
        raise _BadEvent(f"data.{name} must be a string of 1-{MAX_TEXT} characters, without NUL")
    return value


def _order(event: Event) -> tuple[dict[str, Any], str]:
    data = event.payload.get("data")
    if not isinstance(data, dict):
        raise _BadEvent("the event needs a data object with an order_id")
    return data, _text(data, "order_id")


def _cents(data: dict[str, Any]) -> int:
    value = data.get("amount_cents", 0)
    # A JSON integer only: a float or a string of digits is a sender's bug, not an amount.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CENTS:
        raise _BadEvent(f"data.amount_cents must be a whole number of cents, 0-{MAX_CENTS}")
    return value


def _refused(exc: _BadEvent) -> JSONResponse:
    # Final: the same event will not become valid on a retry. The message names the field,
    # never echoes its value.
    return JSONResponse({"error": str(exc)}, status_code=422)


async def order_created(event: Event, tx: Connection) -> Any:
    try:
        data, order_id = _order(event)
        customer = _text(data, "customer", "unknown")
        amount = _cents(data)
    except _BadEvent as exc:
        return _refused(exc)
    existing = await tx.fetchval("SELECT status FROM orders WHERE id = $1", order_id)
    if existing is not None:
        # A different webhook-id for an order we already have: the sender made a new event
        # for the same business object. Absolute writes make this harmless; say so.
        return {"order_id": order_id, "status": existing, "note": "already known"}
    await tx.execute(
        "INSERT INTO orders (id, customer, amount_cents, status, updated_by)"
        " VALUES ($1, $2, $3, 'created', $4)",
        order_id,
        customer,
        amount,
        event.id,
    )
    return {"order_id": order_id, "status": "created"}


async def _set_status(event: Event, tx: Connection, status: str) -> Any:
    try:
        _, order_id = _order(event)
    except _BadEvent as exc:
        return _refused(exc)
    found = await tx.fetchval("SELECT id FROM orders WHERE id = $1", order_id)
    if found is None:
        # Final, not retryable: retrying will not make the order exist.
        return JSONResponse({"error": f"unknown order {order_id}"}, status_code=422)
    await tx.execute(
        "UPDATE orders SET status = $1, updated_by = $2 WHERE id = $3",
        status,
        event.id,
        order_id,
    )
    return {"order_id": order_id, "status": status}


async def order_paid(event: Event, tx: Connection) -> Any:
    return await _set_status(event, tx, "paid")


async def order_cancelled(event: Event, tx: Connection) -> Any:
    return await _set_status(event, tx, "cancelled")


def register(rx: Receiver) -> None:
    """Register the order book on ``rx`` (``handlers = ["handlers"]`` in a config file)."""
    rx.on_startup(create_tables)
    rx.add_handler("order.created", order_created)
    rx.add_handler("order.paid", order_paid)
    rx.add_handler("order.cancelled", order_cancelled)


_demo: Receiver | None = None


def __getattr__(name: str) -> Receiver:
    """``rx`` and ``app``: the demo Receiver that ``receiver serve`` runs without ``--config``.

    Built on first use rather than at import, so that a config file can import this module
    (for :func:`register`) without RECEIVER_SECRET.
    """
    global _demo
    if name not in ("rx", "app"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _demo is None:
        store = os.environ.get("RECEIVER_STORE", "sqlite:///receiver.db")
        secrets = [s.strip() for s in os.environ.get("RECEIVER_SECRET", "").split(",") if s.strip()]
        if not secrets:
            raise ConfigurationError(
                "the demo app needs RECEIVER_SECRET (a whsec_... secret); `receiver serve` "
                "generates one for you and prints it"
            )
        demo = Receiver(
            store,
            [Provider("demo", secrets, schedule="svix")],
            trusted_proxies=os.environ.get("RECEIVER_TRUSTED_PROXIES", ""),
        )
        register(demo)
        _demo = demo
    return _demo
