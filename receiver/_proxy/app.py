"""An idempotency proxy: the Idempotency-Key middleware's semantics in front of an upstream that
accepts no key (a vendor's API, a service in another language).

A keyed request is claimed in the ledger, forwarded once (with a key derived from the client's
in ``key_header``, for upstreams that honour one), and the upstream's answer is stored and
replayed byte for byte to every retry: the same key with another request is 422, one in flight
409 with Retry-After. The answer reaches the client only once it is stored.

Forwarding is an external effect, so a claim is given back only when the upstream cannot have
acted: the connection was never made, or it answered with one of ``retry_statuses`` (429 and 503
by default: "not now"). Any other 5xx, a timeout or a broken connection after sending, and a
proxy that died mid-way leave the attempt in flight; the next retry (or the sweeper) settles it
through ``reconcile(attempt)`` (ask the upstream), by forwarding again when the upstream
deduplicates by the forwarded key (``upstream_deduplicates=True``), or else as a failure that
needs review (409, listed by the console). It is never forwarded again blindly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import orjson
from prometheus_client import CollectorRegistry
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from .._exceptions import ConfigurationError, InvalidIdempotencyKey, LeaseLost, StoreUnavailable
from .._idempotency import settings
from .._idempotency.body import BodyTooLarge, ClientGone, read_body
from .._idempotency.key import parse_key
from .._idempotency.middleware import (
    _NO_PRINCIPAL,
    _fingerprint,
    _problem,
    _unavailable,
    principal_of,
)
from .._ledger import keyed
from .._ledger.cache import ReplayCache
from .._ledger.keyed import KeyState
from .._ledger.receipts import Claim, Claimed, Decision, Key, Receipt, State, StoredResponse, decide
from .._ledger.responses import replay
from .._ops.durations import Durations
from .._ops.forwarded import TrustedProxies
from .._ops.sweeper import KeySweeper, SweepReport
from .._store.base import Store
from . import forward
from .attempt import (
    SCOPE_KEY,
    ProxiedRequest,
    Reconcile,
    bad_gateway,
    envelope,
    passed_on,
    proxied_request_of,
    stored,
    upstream_key,
)
from .metrics import ProxyMetrics
from .recovery import Recovery

logger = logging.getLogger("receiver.proxy")

NAMESPACE = "proxy"
Principal = Callable[[Scope], str | Awaitable[str]]


def authorization_principal(scope: Scope) -> str:
    """The default principal: who the upstream will think the caller is, from a hash of the
    Authorization header (never the credential itself), or ``anonymous``."""
    for name, value in scope["headers"]:
        if name.lower() == b"authorization":
            return "auth:" + hashlib.sha256(value).hexdigest()[:32]
    return "anonymous"


class IdempotencyProxy(Recovery):
    """An ASGI app in front of one upstream:

    ```python
    proxy = IdempotencyProxy("https://api.vendor.example", store=store,
                             paths=["/v1/payments", "/v1/refunds/*"], reconcile=ask_vendor)
    ```

    ``methods``/``paths``/``required``: which requests are keyed and where a key is required,
    as for the middleware; every other request is streamed through untouched. ``principal``:
    whose keys (default: a hash of the Authorization header). ``key_header``: the header the
    upstream gets the key in (None: none); ``forward_key``: ``"derived"`` (stable per principal
    and key, the default) or ``"client"`` (the client's own). ``timeout``: the whole upstream
    call, at most ``lease``; ``connect_timeout``: making the connection. ``verify``: TLS to the
    upstream (True, a CA file, an ``ssl.SSLContext``). ``max_body_size``/``max_response_size``:
    what a keyed request and its stored answer may hold. ``trusted_proxies``: the
    addresses or networks of proxies in front of this one, whose X-Forwarded-* headers are passed
    on (anyone else's are replaced by what the proxy saw). ``store_owned``: open and close the
    store with the app's lifespan (the CLI does).
    """

    def __init__(
        self,
        upstream: str,
        *,
        store: Store,
        principal: Principal = authorization_principal,
        methods: Sequence[str] = ("POST", "PATCH"),
        paths: Sequence[str] | None = None,
        required: Sequence[str] = (),
        key_header: str | None = "Idempotency-Key",
        forward_key: str = "derived",
        reconcile: Reconcile | None = None,
        upstream_deduplicates: bool = False,
        retry_statuses: Sequence[int] = (429, 503),
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        lease: float = 60.0,
        ttl: float = 86_400.0,
        wait: float = 0.0,
        max_body_size: int = 1024 * 1024,
        max_response_size: int = 10 * 1024 * 1024,
        namespace: str = "default",
        replay_cache: int = 10_000,
        sweep_interval: float | None = 60.0,
        verify: Any = True,
        trusted_proxies: Sequence[str] | str = (),
        registry: CollectorRegistry | None = None,
        store_owned: bool = False,
    ) -> None:
        forward.check_upstream(upstream)
        timeout, lease = settings.seconds("timeout", timeout), settings.seconds("lease", lease)
        ttl = settings.seconds("ttl", ttl)
        if not timeout < lease <= ttl:
            raise ConfigurationError(
                f"need timeout ({timeout!r} s) < lease ({lease!r} s) <= ttl ({ttl!r} s): an "
                "upstream call must end before its claim's lease does"
            )
        connect_timeout = settings.seconds("connect_timeout", connect_timeout)
        wait = settings.seconds("wait", wait, zero=True)
        max_body_size = settings.size("max_body_size", max_body_size)
        max_response_size = settings.size("max_response_size", max_response_size)
        if forward_key not in ("derived", "client"):
            raise ConfigurationError(
                f"forward_key must be 'derived' or 'client', not {forward_key!r}"
            )
        if reconcile is not None and not inspect.iscoroutinefunction(reconcile):
            raise ConfigurationError("reconcile must be an 'async def' taking the attempt")
        retry_statuses = () if isinstance(retry_statuses, str) else tuple(retry_statuses)
        if any(type(s) is not int or not (500 <= s <= 599 or s == 429) for s in retry_statuses):
            raise ConfigurationError("retry_statuses holds 429 and 5xx statuses only")
        settings.check_principal(principal)
        self.upstream = upstream.rstrip("/") + "/"
        self.store = store
        self.principal = principal
        self.methods = settings.methods_of(methods)
        self.paths, self.required = settings.patterns_of(paths, required)
        self.key_header = None if key_header is None else forward.header_name(key_header)
        self.forward_key = forward_key
        self.reconcile = reconcile
        self.upstream_deduplicates = upstream_deduplicates
        self.retry_statuses = frozenset(retry_statuses)
        self.timeout, self.connect_timeout, self.verify = timeout, connect_timeout, verify
        self.trusted_proxies = TrustedProxies(trusted_proxies)
        self.lease, self.ttl, self.wait = lease, ttl, wait
        self.max_body_size, self.max_response_size = max_body_size, max_response_size
        self.provider = f"{NAMESPACE}:{settings.namespace_of(namespace)}"
        self.store_owned = store_owned
        self.metrics = ProxyMetrics(registry)
        self.durations = Durations()
        interval = settings.sweep_interval(sweep_interval)
        self.sweeper = KeySweeper(store, {NAMESPACE: self.recover}, interval)
        self._waiters = keyed.Waiters()
        self._cache = ReplayCache(replay_cache) if replay_cache > 0 else None
        # Made now, so that a CA file that cannot be read fails at start-up, not on a request.
        self._client: httpx.AsyncClient | None = None
        self._client = self.client
        #: The step that calls the upstream, an ASGI app (receiver.testing wraps it with faults).
        self.app: Any = self._forward

    @property
    def client(self) -> httpx.AsyncClient:
        """The proxy's HTTP client to the upstream (made on first use, closed at shutdown)."""
        if self._client is None:
            self._client = forward.client_for(
                self.upstream,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                verify=self.verify,
            )
        return self._client

    async def inspect(self, principal: str, key: str) -> KeyState | None:
        """What the ledger holds for ``key`` of ``principal``, read without acting on it."""
        return await keyed.inspect(self.store, self._key(principal, key))

    async def sweep(self, *, batch: int = 100) -> SweepReport:
        """One sweeper pass: settle attempts nobody retries, delete expired keys."""
        return await self.sweeper.run_once(batch=batch)

    async def aclose(self) -> None:
        await self.sweeper.stop()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not proxied
        try:
            url = forward.target(self.upstream, scope)
            forward.check_headers(scope)
        except forward.BadTarget as exc:
            self.metrics.count("refused")
            await _problem(400, "invalid-target", "Request cannot be forwarded", str(exc))(
                scope, receive, send
            )
            return
        if scope["method"] not in self.methods or (
            self.paths is not None and not settings.matches(self.paths, scope["path"])
        ):
            await self._pass(scope, receive, send, url)
            return
        values = [v for k, v in scope["headers"] if k.lower() == b"idempotency-key"]
        try:
            key = parse_key(values)
        except InvalidIdempotencyKey as exc:
            self.metrics.count("refused")
            await _problem(400, "invalid-key", "Invalid Idempotency-Key", str(exc))(
                scope, receive, send
            )
            return
        if key is None:
            if settings.matches(self.required, scope["path"]):
                self.metrics.count("refused")
                detail = "this endpoint requires an Idempotency-Key header"
                await _problem(400, "missing-key", "Idempotency-Key required", detail)(
                    scope, receive, send
                )
                return
            await self._pass(scope, receive, send, url)
            return
        try:
            body = await read_body(receive, self.max_body_size)
        except BodyTooLarge:
            self.metrics.count("refused")
            detail = f"the body exceeds {self.max_body_size} bytes"
            await _problem(413, "too-large", "Request body too large", detail)(scope, receive, send)
            return
        except ClientGone:
            return  # nobody is listening; nothing was claimed or forwarded
        principal = await principal_of(self.principal, scope)
        if principal is None:
            await _NO_PRINCIPAL(scope, receive, send)
            return
        try:
            response = await self._keyed(scope, key, principal, body, url)
        except StoreUnavailable as exc:
            self.metrics.count("unavailable")
            response = _unavailable(exc)
        if response is not None:
            await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.store_owned:
                        await self.store.open()
                    self.sweeper.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                if self.store_owned:
                    await self.store.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _pass(self, scope: Scope, receive: Receive, send: Send, url: httpx.URL) -> None:
        """No key needed: streamed through, nothing stored."""
        self.metrics.count("passed")
        try:
            await forward.stream(self.client, url, scope, receive, send, self.trusted_proxies)
        except forward.NotSent as exc:
            self.metrics.upstream_errors.labels(exc.kind).inc()
            await bad_gateway(502, "the upstream could not be reached")(scope, receive, send)
        except forward.Unknown as exc:
            self.metrics.upstream_errors.labels(exc.kind).inc()
            await bad_gateway(504, "the upstream did not answer in time")(scope, receive, send)

    # -- the keyed path ------------------------------------------------------------------------

    def _key(self, principal: str, key: str) -> Key:
        return Key(self.provider, orjson.dumps([principal, key]).decode())

    async def _keyed(
        self, scope: Scope, key: str, principal: str, body: bytes, url: httpx.URL
    ) -> Response | None:
        """Claim the key, then forward, replay, recover or refuse. None: the answer was sent."""
        claim = Claim(
            self._key(principal, key),
            # The path as forwarded, not as decoded: /a%2Fb and /a/b are two upstream paths.
            _fingerprint(scope, body, scope.get("raw_path") or scope["path"].encode()),
            None,
            envelope(scope, body),
            self.store.now(),
            self.lease,
            self.ttl,
        )
        request = ProxiedRequest(key, principal, 0, self._upstream_key(claim.key, key), url)
        hit = None if self._cache is None else self._cache.get(claim.key, time.time())
        if hit is not None:
            if hit.payload_hash == claim.payload_hash:
                self.metrics.count("replayed")
                return replay(hit.response, replayed=True)
            return self._mismatch()
        for _ in range(100):
            got = await keyed.claim(self.store, claim)
            if isinstance(got, Claimed):
                return await self._attempt(scope, claim, got.fence, request, body)
            decision = decide(got, claim.payload_hash)
            if decision is Decision.REPLAY:
                assert got.response is not None
                if got.state is State.COMPLETED:
                    self._remember(claim, got.response, got.expires_at - got.now)
                self.metrics.count("replayed")
                return replay(got.response, replayed=True)
            if decision is Decision.MISMATCH:
                return self._mismatch()
            if decision is Decision.IN_FLIGHT:
                if self.wait > 0:
                    latest = await self._waiters.wait(self.store, claim.key, self.wait)
                    if latest is None or not keyed.live(latest):
                        continue
                    got = latest
                return self._in_flight(got, scope["path"])
            if decision is Decision.RECOVER:
                taken = await self._take_over(claim, got)
                if taken is None:
                    continue  # another retry took it over first: look again
                return await self._recover(scope, claim, taken, got.now, request, body)
            fence = await keyed.reclaim(self.store, claim, got.fence)
            if fence is None:
                continue
            return await self._attempt(scope, claim, fence, request, body)
        return self._in_flight(None, scope["path"])

    def _upstream_key(self, key: Key, client_key: str) -> str:
        return client_key if self.forward_key == "client" else upstream_key(key)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The upstream call as an ASGI app: the keyed request's body from ``receive``, the whole
        answer to ``send``. Raises forward.NotSent, forward.Unknown, forward.AnswerTooLarge."""
        context = proxied_request_of(scope)
        message = await receive()
        extra = (
            [] if self.key_header is None else [(self.key_header, context.upstream_key.encode())]
        )
        began = time.monotonic()
        async with asyncio.timeout(self.timeout):
            got = await forward.exchange(
                self.client,
                context.url,
                scope,
                message.get("body", b""),
                extra,
                self.max_response_size,
                self.trusted_proxies,
            )
        self.metrics.upstream_seconds.observe(time.monotonic() - began)
        headers = [*got.headers, (b"content-length", str(len(got.body)).encode())]
        await send({"type": "http.response.start", "status": got.status, "headers": headers})
        await send({"type": "http.response.body", "body": got.body})

    async def _attempt(
        self, scope: Scope, claim: Claim, fence: int, request: ProxiedRequest, body: bytes
    ) -> Response | None:
        """Forward under ``fence`` and store the answer; what a failure means depends on whether
        the upstream may have acted (module docstring)."""
        request = dataclasses.replace(request, fence=fence)
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        async def the_body() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        with self._waiters.running(claim.key):
            began = time.monotonic()
            try:
                await self.app({**scope, SCOPE_KEY: request}, the_body, capture)
            except forward.NotSent as exc:
                return await self._released(
                    claim, fence, exc.kind, 502, "the upstream could not be reached"
                )
            except forward.AnswerTooLarge as exc:
                self.metrics.upstream_errors.labels("too_large").inc()
                return await self._review(claim, fence, str(exc))
            except (Exception, asyncio.CancelledError) as exc:
                kind = exc.kind if isinstance(exc, forward.Unknown) else type(exc).__name__
                if isinstance(exc, TimeoutError):
                    kind = "timeout"
                await self._unresolved(claim, fence, kind)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                status = 504 if kind == "timeout" else 502
                return bad_gateway(
                    status, "the upstream's answer was lost; it may have acted: retry"
                )
            self.durations.observe(scope["path"], time.monotonic() - began)
            if start is None:
                await self._unresolved(claim, fence, "no answer")
                return bad_gateway(502, "the upstream sent no answer")
            status = int(start["status"])
            answer_headers = [(bytes(n), bytes(v)) for n, v in start.get("headers", [])]
            answer = b"".join(chunks)
            if status in self.retry_statuses:
                # The upstream said "not now" without acting: given back, passed on unstored.
                await self._released(claim, fence, f"upstream {status}", None, "")
                return passed_on(status, answer_headers, answer)
            if status >= 500:
                self.metrics.upstream_errors.labels("5xx").inc()
                await self._unresolved(claim, fence, f"upstream {status}")
                return passed_on(status, answer_headers, answer)
            result = stored(status, answer_headers, answer)
            try:
                await keyed.complete(self.store, None, claim.key, fence, result)
            except LeaseLost:
                detail = "a newer attempt took this key over; this answer was not stored"
                return _problem(409, "lease-lost", "Request superseded", detail, retry_after=1)
        self._remember(claim, result, self.ttl)
        self.metrics.count("forwarded")
        return passed_on(status, answer_headers, answer)

    async def _released(
        self, claim: Claim, fence: int, kind: str, status: int | None, detail: str
    ) -> Response | None:
        self.metrics.count("released")
        if status is not None:
            self.metrics.upstream_errors.labels(kind).inc()
        await asyncio.shield(keyed.release(self.store, claim.key, fence, f"released: {kind}"))
        return None if status is None else bad_gateway(status, detail)

    async def _unresolved(self, claim: Claim, fence: int, kind: str) -> None:
        """The upstream may have acted: the attempt stays in flight with its lease ended, for the
        next retry or the sweeper to settle; shielded, so that a cancellation cannot skip it."""
        self.metrics.count("unknown")
        logger.error(
            "upstream call interrupted after sending (%s); kept in flight for reconcile",
            kind,
            extra={"provider": claim.key.provider},
        )
        # The error says how the attempt ended: attempt.interrupted() reads it back for reconcile.
        await asyncio.shield(keyed.unresolved(self.store, claim.key, fence, f"upstream: {kind}"))

    def _remember(self, claim: Claim, result: StoredResponse, left: float) -> None:
        if self._cache is not None:
            self._cache.put(claim.key, claim.payload_hash, result, time.time() + left)

    def _mismatch(self) -> Response:
        self.metrics.count("mismatch")
        logger.warning("ALERT: Idempotency-Key reused with a different request (proxy)")
        detail = "this Idempotency-Key was already used with a different request"
        return _problem(422, "key-reused", "Idempotency-Key reused", detail)

    def _in_flight(self, receipt: Receipt | None, path: str) -> Response:
        self.metrics.count("in_flight")
        wait = (
            1
            if receipt is None
            else self.durations.retry_after(
                path, receipt.now - receipt.claimed_at, receipt.lease_until - receipt.now
            )
        )
        detail = "a request with this Idempotency-Key is still being forwarded; retry later"
        return _problem(409, "in-flight", "Request in progress", detail, retry_after=wait)

    def __repr__(self) -> str:
        return f"IdempotencyProxy({self.upstream!r}, store={self.store.url!r})"
