"""How the proxy settles an attempt that may have reached the upstream and stored nothing (a
timeout, a 5xx, a proxy that died mid-way): ``reconcile(attempt)`` asks the upstream; an upstream
that deduplicates by the forwarded key gets the request again; otherwise it is stored as a
failure that needs review. Never forwarded again blindly. Used by a client's retry (the
request is at hand) and by the sweeper (the request as the ledger kept it, headers aside).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

import orjson
from starlette.responses import Response
from starlette.types import Scope

from .._ledger import keyed
from .._ledger.receipts import Claim, Key, Receipt, StoredResponse, lookup
from .._ledger.responses import replay
from .._ledger.results import RunAgain
from .._ops.redact import describe
from .._ops.review import record_review
from .attempt import (
    Interrupted,
    ProxiedRequest,
    ProxyAttempt,
    bad_gateway,
    carrying,
    interrupted,
    reconciled,
    unwrap,
)

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

    def _in_flight(self, receipt: Receipt | None, path: str) -> Response:
        raise NotImplementedError

    async def _take_over(
        self, claim: Claim, receipt: Receipt
    ) -> tuple[int, Interrupted | None] | None:
        """Reclaim an interrupted attempt to settle it: the next fence, and (for reconcile) how
        the attempt ended, carried in the new fence's envelope should this reconcile raise.
        None: another caller took it over first."""
        record = None if self.reconcile is None else await self._interrupted(receipt)
        if record is not None:
            claim = dataclasses.replace(claim, body=carrying(claim.body, record))
        fence = await keyed.reclaim(self.store, claim, receipt.fence)
        return None if fence is None else (fence, record)

    async def _interrupted(self, receipt: Receipt) -> Interrupted:
        key = receipt.key
        async with self.store.acquire() as conn:
            rows = await conn.run_all("list_attempts", key.provider, key.webhook_id)
            if receipt.request_body is None:  # a claim's answer leaves the envelope out
                current = await lookup(conn, key, self.store.now())
                if current is not None and current.fence == receipt.fence:
                    receipt = current
        error = next((str(r["error"]) for r in rows if int(r["fence"]) == receipt.fence), None)
        return interrupted(receipt, error)

    async def _recover(
        self,
        scope: Scope,
        claim: Claim,
        taken: tuple[int, Interrupted | None],
        now: float,
        request: ProxiedRequest,
        body: bytes,
    ) -> Response | None:
        """A retry found an attempt that may have acted and stored nothing (and took it over,
        ``taken``, at the ledger's time ``now``): settle it first."""
        fence, record = taken
        if self.reconcile is None or record is None:
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
            record.interruption,
            record.status,
            record.began,
            max(0.0, now - record.began),
        )
        try:
            answer = await self.reconcile(attempt)
            if isinstance(answer, RunAgain):
                # Given back and taken again, so that the new attempt's own claim says when it
                # was forwarded (``began``), should it be interrupted too.
                await keyed.release(self.store, claim.key, fence, "reconciled: not done")
                claim = dataclasses.replace(claim, now=self.store.now())
                again = await keyed.reclaim(self.store, claim, fence)
                if again is None:  # another retry took it over in between: it forwards
                    return self._in_flight(None, scope["path"])
                return await self._attempt(scope, claim, again, request, body)
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
        taken = await self._take_over(claim, receipt)
        if taken is None:
            return "skipped"
        fence, record = taken
        if self.reconcile is None or record is None:
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
            record.interruption,
            record.status,
            record.began,
            max(0.0, receipt.now - record.began),
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
