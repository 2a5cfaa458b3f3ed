"""Claims and completions that concurrent deliveries share.

The pipeline asks for one delivery's claim, or one receipt's completion (for handlers that
never touched ``tx``). Where the store batches (``Store.batch_flushes``: PostgreSQL, and SQLite's
group commit), each request takes a place in the next batched statement of a
:class:`~receiver._ledger.batcher.Batcher`; elsewhere it is a statement of its own. Either way the
caller gets its own result, and one item's problem never fails its neighbours: a batch that
fails for any reason but the store being down is retried item by item.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._exceptions import LeaseLost, StoreUnavailable
from .._logging import get_logger
from .._store.base import Store
from . import receipts as ledger
from .batcher import Batcher
from .receipts import Claim, Key, Receipt, State, StoredResponse

logger = get_logger("receiver")

ClaimResult = ledger.Claimed | Receipt


class SharedStatements:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.claims: Batcher[Claim, ClaimResult | None] | None = None
        self.completions: Batcher[ledger.Completion, bool] | None = None
        if store.batch_flushes:
            self.claims = Batcher(self.flush_claims, max_in_flight=store.batch_flushes)
            self.completions = Batcher(self.flush_completions, max_in_flight=store.batch_flushes)

    async def claim(self, claim: Claim) -> ClaimResult:
        """Claim the key: :class:`~receiver._ledger.receipts.Claimed`, or the receipt already
        there."""
        if self.claims is None:
            async with self.store.acquire() as conn:
                return await ledger.claim(conn, claim)
        for _ in range(3):
            got = await self.claims.submit(claim)
            if got is not None:
                return got
            # Another claim of the same batch won the key, or a concurrent one committed just
            # after the batch's snapshot: the row is there now.
            async with self.store.acquire() as conn:
                existing = await ledger.lookup(conn, claim.key, claim.now)
            if existing is not None:
                return existing
        raise LeaseLost(f"receipt {claim.key.webhook_id!r} kept vanishing while being claimed")

    async def complete(
        self, key: Key, fence: int, stored: StoredResponse, state: State = State.COMPLETED
    ) -> None:
        """Complete a receipt whose handlers wrote nothing. LeaseLost if the fence is stale."""
        if self.completions is None:
            async with self.store.acquire() as conn:
                await ledger.complete(conn, key, fence, stored, self.store.now(), state=state)
            return
        if not await self.completions.submit(ledger.Completion(key, fence, stored, state)):
            raise LeaseLost(f"fence {fence} of {key.provider}/{key.webhook_id} is stale")

    async def flush_claims(
        self, claims: Sequence[Claim]
    ) -> Sequence[ClaimResult | BaseException | None]:
        async with self.store.acquire() as conn:
            # Alone (low load), the keyed statement, lighter for both sides than the batched
            # one; a batch whose statement fails is claimed one by one below.
            if len(claims) > 1:
                try:
                    return await ledger.claim_many(conn, claims, self.store.now())
                except StoreUnavailable:
                    raise
                except Exception:
                    logger.exception("batched claim failed; claiming one by one")
            results: list[ClaimResult | BaseException | None] = []
            for claim in claims:
                try:
                    results.append(await ledger.claim(conn, claim))
                except StoreUnavailable:
                    raise
                except Exception as exc:
                    results.append(exc)
            return results

    async def flush_completions(
        self, completions: Sequence[ledger.Completion]
    ) -> Sequence[bool | BaseException]:
        async with self.store.acquire() as conn:
            if len(completions) > 1:  # alone: the keyed statement below, as for claims
                try:
                    return await ledger.complete_many(conn, completions, self.store.now())
                except StoreUnavailable:
                    raise
                except Exception:
                    logger.exception("batched completion failed; completing one by one")
            results: list[bool | BaseException] = []
            for c in completions:
                try:
                    now = self.store.now()
                    await ledger.complete(conn, c.key, c.fence, c.response, now, state=c.state)
                    results.append(True)
                except LeaseLost:
                    results.append(False)
                except StoreUnavailable:
                    raise
                except Exception as exc:
                    results.append(exc)
            return results
