"""Receipts stored under the key a scheme gave before it keyed on the sender's event id.

GitHub, Shopify and Twilio deliveries were once keyed on what the sender signs (``"sha256:"``
and a digest of the body or of the signed parameters); they are keyed on the sender's event id
now (docs/explanation/keys.md). A redelivery of an event received before the upgrade carries
the event id, so its new key finds nothing: this module looks its old key up first, and where
a receipt of the same event type is there, the delivery keeps that key, and with it its
receipt's answer (replayed, in flight, or run again where it was released).

The transition is bounded by the ledger itself: once per process and provider, the latest
expiry of its receipts under a digest key is read; until then each delivery of that provider
costs one more lookup by primary key, after it none. Receipts written by a replica of the
earlier version after this process read that horizon are not seen: finish a rolling upgrade
before the earlier version's receipts matter, or restart the new replicas once it is done.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from .._ledger import receipts as ledger
from .._ledger.receipts import Key
from .._store.base import Store
from .._verification.ids import legacy_key_of
from .jobs import Job
from .providers import Provider


class LegacyKeys:
    """Finds the receipt a delivery had under its scheme's earlier key, while there can be one."""

    __slots__ = ("_until", "store")

    def __init__(self, store: Store) -> None:
        self.store = store
        #: Per provider: until when (time.monotonic()) a receipt under an earlier key may exist.
        self._until: dict[str, float] = {}

    async def rekey(self, provider: Provider, job: Job) -> Job:
        """``job`` under its earlier key where a receipt of the same event is stored there,
        else ``job`` as it is. Raises StoreUnavailable as any ledger read does."""
        until = self._until.get(provider.name)
        if until is not None and time.monotonic() >= until:
            return job  # the transition is over: not even the earlier key is computed
        earlier = legacy_key_of(provider.verifier, job.claim.body)
        if earlier is None or earlier == job.claim.key.webhook_id:
            return job
        async with self.store.acquire() as conn:
            if until is None:
                row = await conn.run("legacy_horizon", provider.name, job.claim.now)
                left = (
                    -math.inf if row is None or row["until"] is None else row["until"] - row["now"]
                )
                self._until[provider.name] = time.monotonic() + left
                if left <= 0:
                    return job
            receipt = await ledger.lookup(conn, Key(provider.name, earlier), job.claim.now)
        # The same body under another topic is another event (Shopify's products/create and
        # products/update): it keeps its own key.
        if receipt is None or receipt.event_type != job.claim.event_type:
            return job
        return replace(job, claim=replace(job.claim, key=receipt.key))
