"""One Receiver with a provider per built-in scheme, for the kit's own tests: in-process
(``build(store, clock)``) and in a real ``receiver serve`` process (``rx``, from the
``RECEIVER_STORE`` variable). Every delivery writes one ``kit_orders`` row through ``tx``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from receiver import Connection, Event, GitHub, Provider, Receiver, Shopify, Slack, Store, Stripe

STANDARD = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SIGNING_KEY = "whsk_c9/oDDjT1RbhD5o5LTA+TrGMc1kZz0+XFIDd61Qg94k="
PUBLIC_KEY = "whpk_/uzl04HnkTUjeWyFqRNGijUk7/IEVLhRtJYAupUZLGU="
STRIPE = "whsec_stripeEndpointSecret"
GITHUB = "a github webhook secret"
SHOPIFY = "shopify-client-secret"
SLACK = "8f742231b10e8888abcd99yyyzzz85a5"

#: provider -> (signing secret, scheme, an event type its sender sends)
SENDERS: dict[str, tuple[str, str, str]] = {
    "acme": (STANDARD, "standard-webhooks", "order.created"),
    "acme-v1a": (SIGNING_KEY, "standard-webhooks", "order.created"),
    "stripe": (STRIPE, "stripe", "invoice.paid"),
    "github": (GITHUB, "github", "issues.opened"),
    "shopify": (SHOPIFY, "shopify", "orders/create"),
    "slack": (SLACK, "slack", "app_mention"),
}

ORDERS_DDL = (
    "CREATE TABLE IF NOT EXISTS kit_orders ("
    " provider TEXT NOT NULL, webhook_id TEXT NOT NULL, type TEXT NOT NULL)"
)


def build(
    store: Store | str,
    clock: Callable[[], float] = time.time,
    *,
    stripe_ttl: float | None = None,
) -> Receiver:
    rx = Receiver(
        store,
        [
            Provider("acme", [STANDARD]),
            Provider("acme-v1a", [PUBLIC_KEY]),
            Provider("stripe", verifier=Stripe([STRIPE]), schedule="stripe", ttl=stripe_ttl),
            Provider("github", verifier=GitHub([GITHUB]), schedule="github"),
            Provider("shopify", verifier=Shopify([SHOPIFY]), schedule="shopify"),
            Provider("slack", verifier=Slack([SLACK]), schedule="slack"),
        ],
        clock=clock,
        sweep_interval=None,
    )

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(ORDERS_DDL)

    @rx.on("*")
    async def record(event: Event, tx: Connection) -> Any:
        await tx.execute(
            "INSERT INTO kit_orders (provider, webhook_id, type) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.type,
        )
        return {"recorded": event.id, "type": event.type, "fence": event.fence}

    return rx


rx = build(os.environ["RECEIVER_STORE"]) if "RECEIVER_STORE" in os.environ else None
