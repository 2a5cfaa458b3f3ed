"""The application the console tests look at: a shop whose order handler the test can make
fail, with a run count per webhook-id, and helpers that put receipts into each state the
console shows (through the Receiver, or through the ledger's own functions where only a crash
would get there)."""

from __future__ import annotations

import collections
from typing import Any

from receiver import Provider, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Claimed, Key, StoredResponse
from receiver._ops.review import needs_review
from receiver.testing import Sender, Webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOKEN = "console-test-token-7c1f0e9a42"
NEEDS_REVIEW = StoredResponse(
    202, "application/json", b'{"status":"needs_review","detail":"interrupted external attempt"}'
)


class Shop:
    def __init__(self, store: Store | str) -> None:
        self.rx = Receiver(
            store=store,
            providers=[Provider("shop", secrets=[SECRET]), Provider("billing", secrets=[SECRET])],
            sweep_interval=None,
        )
        self.runs: collections.Counter[str] = collections.Counter()
        self.failing: set[str] = set()
        self.sent: dict[str, Webhook] = {}
        self.rx.add_handler("order.*", self.order)
        self.rx.add_handler("invoice.paid", self.order, provider="billing")

    async def order(self, event: Any, tx: Any) -> dict[str, Any]:
        self.runs[event.id] += 1
        if event.id in self.failing:
            raise RuntimeError("inventory service timed out")
        return {"order": event.payload["data"].get("id"), "run": self.runs[event.id]}

    async def send(
        self, webhook_id: str, type: str = "order.created", provider: str = "shop", **data: Any
    ) -> int:
        """Deliver one event (again, if the id was sent before: the same body); the status."""
        async with Sender(self.rx, provider, SECRET) as sender:
            webhook = self.sent.get(webhook_id) or sender.event(
                type, {"id": webhook_id, **data}, id=webhook_id
            )
            self.sent[webhook_id] = webhook
            delivery = await sender.send(webhook)
        assert delivery.status is not None
        return delivery.status

    async def needs_review(self, webhook_id: str, provider: str = "shop") -> None:
        """What an interrupted external attempt without reconcile() leaves: a claim, then the
        needs-review answer stored as failed, by the function every such path uses."""
        store = self.rx.store
        key = Key(provider, webhook_id)
        async with store.acquire() as conn:
            got = await ledger.claim(
                conn, Claim(key, b"h" * 32, "payment.created", b"{}", store.now(), 60, 3600)
            )
            assert isinstance(got, Claimed)
            await needs_review(
                conn,
                key,
                got.fence,
                NEEDS_REVIEW,
                "interrupted external attempt",
                store.now(),
                None,
            )
