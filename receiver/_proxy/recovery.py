"""How the proxy settles an attempt that may have reached the upstream and stored nothing (a
timeout, a 5xx, a proxy that died mid-way): ``reconcile(attempt)`` asks the upstream; an upstream
that deduplicates by the forwarded key gets the request again; otherwise it is stored as a
failure that needs review. Never forwarded again blindly. Used by a client's retry (the
request is at hand) and by the sweeper (the request as the ledger kept it, headers aside).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import orjson
from starlette.responses import Response
from starlette.types import Scope

from .._ledger import keyed
from .._ledger.receipts import Claim, Key, Receipt, StoredResponse
from .._ledger.responses import replay
from .._ledger.results import RunAgain
from .._ops.redact import describe
from .._ops.review import record_review
from .attempt import ProxiedRequest, ProxyAttempt, bad_gateway, reconciled, unwrap

if TYPE_CHECKING:
    import httpx

    from .._store.base import Store
    from .attempt import Reconcile
    from .metrics import ProxyMetrics

logger = logging.getLogger("receiver.proxy")

_NO_RECONCILE = (
    "an attempt was interrupted after it may have reached the upstream, and the proxy has no "
    "reconcile() and the upstream does not deduplicate: it is not forwarded again"
)


class Recovery:
    """The proxy's recovery steps (a part of :class:`~receiver.IdempotencyProxy`)."""

    store: Store
    reconcile: Reconcile | None
    upstream_deduplicates: bool
    lease: float
    ttl: float
    provider: str
    metrics: ProxyMetrics

    @property
    def client(self) -> httpx.AsyncClient:
        raise NotImplementedError

    async def _attempt(
        self, scope: Scope, claim: Claim, fence: int, request: ProxiedRequest, body: bytes
    ) -> Response | None:
        raise NotImplementedError

    def _upstream_key(self, key: Key, client_key: str) -> str:
        raise NotImplementedError

    def _remember(self, claim: Claim, result: StoredResponse, left: float) -> None:
        raise NotImplementedError

    async def _recover(
        self, scope: Scope, claim: Claim, fence: int, request: ProxiedRequest, body: bytes
    ) -> Response | None:
        """A retry found an attempt that may have acted and stored nothing: settle it first."""
        if self.reconcile is None:
            if self.upstream_deduplicates:  # the upstream absorbs a second copy of its key
                return await self._attempt(scope, claim, fence, request, body)
            return await self._review(claim, fence, _NO_RECONCILE)
        method, path, query, _ = unwrap(claim.body)
        attempt = ProxyAttempt(
            method,
            path,
            query,
            body,
            request.key,
            request.principal,
            request.upstream_key,
            self.client,
        )
        try:
            answer = await self.reconcile(attempt)
            if isinstance(answer, RunAgain):
                return await self._attempt(scope, claim, fence, request, body)
            result = reconciled(answer)
        except Exception as exc:
            await asyncio.shield(
                keyed.unresolved(self.store, claim.key, fence, f"reconcile: {describe(exc)}")
            )
            logger.error(
                "reconcile failed (%s); the attempt stays for a later try", type(exc).__name__
            )
            return bad_gateway(502, "what the upstream did is not known yet; retry later")
        await keyed.complete(self.store, None, claim.key, fence, result)
        self.metrics.count("reconciled")
        self._remember(claim, result, self.ttl)
        return replay(result, replayed=False)

    async def recover(self, receipt: Receipt) -> str:
        """The sweeper's recovery of an attempt nobody retries (another proxy's: skipped)."""
        if receipt.key.provider != self.provider:
            return "skipped"
        method, path, query, body = unwrap(receipt.request_body)
        claim = Claim(
            receipt.key,
            receipt.payload_hash,
            None,
            receipt.request_body or b"",
            self.store.now(),
            self.lease,
            self.ttl,
        )
        fence = await keyed.reclaim(self.store, claim, receipt.fence)
        if fence is None:
            return "skipped"
        if self.reconcile is None:
            if self.upstream_deduplicates:
                await keyed.release(self.store, claim.key, fence, "lease expired")
                return "released"
            await self._review(claim, fence, _NO_RECONCILE)
            return "failed"
        principal, key = orjson.loads(receipt.key.webhook_id)
        attempt = ProxyAttempt(
            method,
            path,
            query,
            body,
            key,
            principal,
            self._upstream_key(claim.key, key),
            self.client,
        )
        try:
            answer = await self.reconcile(attempt)
            if isinstance(answer, RunAgain):
                # It did not act: given back, and the client's retry forwards it again.
                await keyed.release(self.store, claim.key, fence, "reconciled: not done")
                return "released"
            await keyed.complete(self.store, None, claim.key, fence, reconciled(answer))
        except Exception as exc:
            await keyed.unresolved(self.store, claim.key, fence, f"reconcile: {describe(exc)}")
            return "skipped"
        self.metrics.count("reconciled")
        return "recovered"

    async def _review(self, claim: Claim, fence: int, detail: str) -> Response:
        """Stored as a failure a person must look at (the console lists it), answered 409."""
        body = orjson.dumps(
            {
                "error": "needs_review",
                "type": "urn:receiver:idempotency:needs-review",
                "title": "Needs review",
                "status": 409,
                "detail": detail,
            }
        )
        answer = StoredResponse(409, "application/problem+json", body)
        async with self.store.acquire() as conn:
            await record_review(conn, claim.key, fence, answer, detail, self.store.now())
        logger.error(
            "ALERT: proxied request needs review: %s",
            detail,
            extra={"provider": claim.key.provider, "fence": fence},
        )
        self.metrics.count("needs_review")
        return replay(answer, replayed=False)
