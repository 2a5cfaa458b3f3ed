"""A small shop that ships an order when Stripe says the invoice is paid.

``build_receiver`` is the factory the tests use: the same app, on a store and a clock the test
gives it. ``uvicorn shop:rx`` serves the real one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from receiver import Connection, Event, Provider, Receiver, Store, Stripe

STRIPE_SECRET = os.environ.get("STRIPE_WEBHOOK_SECRET", "whsec_exampleEndpointSecret")


def build_receiver(store: Store | str, clock: Callable[[], float] = time.time) -> Receiver:
    rx = Receiver(
        store,
        [Provider("stripe", verifier=Stripe([STRIPE_SECRET]), schedule="stripe")],
        clock=clock,
    )

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute("CREATE TABLE IF NOT EXISTS shipments (invoice TEXT NOT NULL)")

    @rx.on("invoice.paid")
    async def ship(event: Event, tx: Connection) -> Any:
        invoice = event.payload["data"]["object"]["id"]
        # Through tx: the shipment commits with the receipt, or not at all.
        await tx.execute("INSERT INTO shipments (invoice) VALUES ($1)", invoice)
        return {"shipped": invoice}

    return rx


rx = build_receiver(os.environ.get("RECEIVER_STORE", "sqlite:///shop.db"))
