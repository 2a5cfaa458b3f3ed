"""``Idempotency-Key`` middleware for any ASGI app, on the receipt ledger.

Follows draft-ietf-httpapi-idempotency-key-header: the first request with a key runs the
endpoint and its answer is stored; every retry with the same key gets that answer again, byte
for byte, with ``Idempotent-Replayed: true``. A missing key where one is required is 400; a
reused key with another request (method, path, query, normalized body) is 422; a key whose
first request is still running is 409 with Retry-After. Errors are ``application/problem+json``
(RFC 9457). A 5xx is never stored, nor a 422 by default (``unstored_statuses``): the key is given
back, and a retry runs the endpoint again.

Keys live in ``receiver_receipts`` under the provider ``idem:<namespace>``, scoped by the
caller's ``principal`` function (the authenticated client or tenant), so two clients never see
each other's answers. An endpoint joins the ledger's transaction by writing through
``idempotent_request(request).tx``: those writes commit together with the stored answer, or not
at all. Other effects are external: see docs/how-to/idempotency-key.md for what a crash
means then.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._exceptions import (
    ConfigurationError,
    InvalidIdempotencyKey,
    LeaseLost,
    StoreMisconfigured,
    StoreReadOnly,
    StoreUnavailable,
)
from .._ledger import keyed
from .._ledger.cache import ReplayCache
from .._ledger.keyed import KeyState
from .._ledger.receipts import Claim, Claimed, Decision, Key, Receipt, State, StoredResponse, decide
from .._ledger.responses import NOT_STORED, replay, unsendable
from .._ledger.shared import SharedStatements
from .._ops.durations import Durations
from .._ops.redact import describe
from .._ops.sweeper import AUDIT_RETENTION, DEAD_LETTER_RETENTION, KeySweeper, SweepReport
from .._store.base import Connection, Store
from .._verification.payload import NotJSON, normalized, raw_form
from . import settings
from .body import BodyTooLarge, ClientGone, read_body
from .key import parse_key

logger = logging.getLogger("receiver.idempotency")

Principal = Callable[[Scope], str | Awaitable[str]]

_SCOPE_KEY = "receiver.idempotency"
_PROBLEM = "application/problem+json"
# What the ledger never stores of an answer, and Set-Cookie: a session, not the answer.
_NOT_STORED = NOT_STORED | {b"set-cookie"}


@dataclass(frozen=True, slots=True)
class IdempotentRequest:
    """What the endpoint of a keyed request can see: ``idempotent_request(request)``."""

    key: str
    principal: str
    fence: int
    #: The ledger's transaction: writes through it commit with the stored answer.
    tx: Connection
    #: For the endpoint's own downstream calls: stable per (principal, key), every attempt.
    downstream_key: str


def idempotent_request(request: Any) -> IdempotentRequest | None:
    """The keyed request's ledger context (a Starlette/FastAPI Request, or an ASGI scope)."""
    scope = request if isinstance(request, dict) else request.scope
    found = scope.get(_SCOPE_KEY)
    return found if isinstance(found, IdempotentRequest) else None


class _Unstored(Exception):
    """The endpoint answered 5xx or what HTTP cannot carry, or raised: roll its writes back and
    give the key back."""


class _Forgotten(_Unstored):
    """One of ``unstored_statuses``: roll back and forget the key (a corrected request is new)."""


class IdempotencyKeyMiddleware:
    """Pure ASGI middleware:

    ```python
    app = Starlette(routes=..., middleware=[Middleware(
        IdempotencyKeyMiddleware, store=store, principal=tenant_of, required=["/payments"],
    )])
    ```

    ``principal(scope)`` names who sent the request (sync or async); keys are per principal.
    ``methods``: the methods keyed (POST and PATCH by default). ``paths``: path patterns keyed
    (an exact path or a prefix ending in ``/*``; None: every path); ``required``: patterns
    where a request without a key is 400 (elsewhere it simply passes through). ``ttl``: how
    long a key and its answer are kept (24 h by default, as Stripe does). ``lease``: how long
    a first request may run before a retry may run the endpoint again. ``wait``: how long a
    concurrent retry waits for the first answer before 409. ``replay_cache``: how many stored
    answers this process keeps to replay without a round trip (0: none).

    ``sweep_interval``: the middleware's own sweeper, started with the app's lifespan: every so
    many seconds (None: never) it gives back the keys of requests that died mid-way (so that a
    retry runs the endpoint, not "in progress" until someone else sweeps) and deletes expired
    keys (keeping a failed one ``dead_letter_retention`` seconds after its ttl, and the
    console's audit records ``audit_retention`` seconds). ``await middleware.sweep()`` runs
    one pass.

    ``unstored_statuses``: the 4xx answers that are not stored, treated like a 5xx (the
    endpoint's writes through ``tx`` roll back, the key is given back, and a retry under the
    same key runs the endpoint again, with a corrected body too). By default 422, FastAPI's
    answer to a request that fails its validation before the endpoint runs, so that a client
    who fixes its request may send it under the same key (as Stripe saves no result for a
    request that failed validation). ``()`` stores every 4xx.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: Store,
        principal: Principal,
        methods: Sequence[str] = ("POST", "PATCH"),
        paths: Sequence[str] | None = None,
        required: Sequence[str] = (),
        ttl: float = 86_400.0,
        lease: float = 60.0,
        wait: float = 0.0,
        max_body_size: int = 1024 * 1024,
        namespace: str = "api",
        replay_cache: int = 10_000,
        sweep_interval: float | None = 60.0,
        dead_letter_retention: float = DEAD_LETTER_RETENTION,
        audit_retention: float = AUDIT_RETENTION,
        unstored_statuses: Collection[int] = (422,),
    ) -> None:
        ttl, lease = settings.seconds("ttl", ttl), settings.seconds("lease", lease)
        if lease > ttl:
            raise ConfigurationError(
                f"lease ({lease!r} s) must be at most the ttl ({ttl!r} s): a key must not expire "
                "while its first request still runs"
            )
        wait = settings.seconds("wait", wait, zero=True)
        max_body_size = settings.size("max_body_size", max_body_size)
        settings.check_principal(principal)
        sweep_interval = settings.sweep_interval(sweep_interval)
        self.app = app
        self.store = store
        self.principal = principal
        # Its recoverer is the sweeper's default for Idempotency-Key keys: release them.
        self.sweeper = KeySweeper(
            store,
            {},
            sweep_interval,
            retention=dead_letter_retention,
            audit_retention=audit_retention,
        )
        #: How long each route usually takes, for Retry-After (receiver/_ops/durations.py).
        self.durations = Durations()
        self.methods = settings.methods_of(methods)
        self.paths, self.required = settings.patterns_of(paths, required)
        self.ttl, self.lease, self.wait = ttl, lease, wait
        self.max_body_size = max_body_size
        self.unstored_statuses = settings.unstored_statuses_of(unstored_statuses)
        self.provider = f"{keyed.IDEMPOTENCY}:{settings.namespace_of(namespace)}"
        self._waiters = keyed.Waiters()
        self._shared = SharedStatements(store)
        # A stored answer never changes until it expires: replays by this process need no
        # round trip (receiver/_ledger/cache.py).
        self._cache = ReplayCache(replay_cache) if replay_cache > 0 else None

    async def inspect(self, principal: str, key: str) -> KeyState | None:
        """What the ledger holds for ``key`` of ``principal`` (the Idempotency-Key's value, as
        the client sent it, unquoted), read without acting on it."""
        webhook_id = orjson.dumps([principal, key]).decode()
        return await keyed.inspect(self.store, Key(self.provider, webhook_id))

    async def sweep(self, *, batch: int = 100) -> SweepReport:
        """One sweeper pass: release keys whose request died, delete expired ones."""
        return await self.sweeper.run_once(batch=batch)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan(receive), send)
            return
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.paths is not None and not settings.matches(self.paths, path):
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k.lower() == b"idempotency-key"]
        try:
            key = parse_key(values)
        except InvalidIdempotencyKey as exc:
            await _problem(400, "invalid-key", "Invalid Idempotency-Key", str(exc))(
                scope, receive, send
            )
            return
        if key is None:
            if settings.matches(self.required, path):
                detail = "this endpoint requires an Idempotency-Key header"
                await _problem(400, "missing-key", "Idempotency-Key required", detail)(
                    scope, receive, send
                )
                return
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body_size)
        except BodyTooLarge:
            detail = f"the body exceeds {self.max_body_size} bytes"
            await _problem(413, "too-large", "Request body too large", detail)(scope, receive, send)
            return
        except ClientGone:
            return  # nobody is listening; nothing was stored
        principal = await principal_of(self.principal, scope)
        if principal is None:
            await _NO_PRINCIPAL(scope, receive, send)
            return
        try:
            response = await self._keyed(scope, receive, send, key, principal, body)
        except StoreUnavailable as exc:
            # The database is down, failing over, or not set up: nothing was answered yet (the
            # answer is sent only after it is stored), so the client may retry.
            response = _unavailable(exc)
        if response is not None:
            await response(scope, receive, send)

    def _lifespan(self, receive: Receive) -> Receive:
        """The app's lifespan messages, passed on; the sweeper runs between its startup and its
        shutdown, as a Receiver's does."""

        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.sweeper.start()
            elif message["type"] == "lifespan.shutdown":
                await self.sweeper.stop()
            return message

        return wrapped

    async def _keyed(
        self, scope: Scope, receive: Receive, send: Send, key: str, principal: str, body: bytes
    ) -> Response | None:
        """Claim the key, then run, replay or refuse. None: the endpoint's answer was sent."""
        claim = Claim(
            Key(self.provider, orjson.dumps([principal, key]).decode()),
            _fingerprint(scope, body),
            None,
            b"",
            self.store.now(),
            self.lease,
            self.ttl,
        )
        arrived = time.time()
        hit = None if self._cache is None else self._cache.get(claim.key, arrived)
        if hit is not None:
            if hit.payload_hash == claim.payload_hash:
                return replay(hit.response, replayed=True)
            return self._mismatch()
        for _ in range(100):
            got = await self._shared.claim(claim)
            if isinstance(got, Claimed):
                return await self._run(
                    scope, receive, send, claim, got.fence, (key, principal, body), arrived
                )
            decision = decide(got, claim.payload_hash)
            if decision is Decision.REPLAY:
                assert got.response is not None
                if got.state is State.COMPLETED:
                    self._remember(claim, got.response, arrived + got.expires_at - got.now)
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
            fence = await keyed.reclaim(self.store, claim, got.fence)
            if fence is not None:
                return await self._run(
                    scope, receive, send, claim, fence, (key, principal, body), arrived
                )
        return self._in_flight(None, scope["path"])

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        claim: Claim,
        fence: int,
        request: tuple[str, str, bytes],
        arrived: float,
    ) -> Response | None:
        """Run the endpoint and store its answer in one transaction (joined by the endpoint's
        writes through ``tx``), fenced; then send the answer."""
        key, principal, body = request
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        sent = False

        async def replayed_body() -> Message:
            # The body was read to fingerprint it: hand it over once, then the client's own
            # messages (its disconnect), as a streaming endpoint listens for them.
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        failure: BaseException | None = None
        with self._waiters.running(claim.key):
            async with self.store.lazy() as tx:
                downstream = "rcv_" + hashlib.sha256(claim.key.webhook_id.encode()).hexdigest()
                context = IdempotentRequest(key, principal, fence, tx, downstream[:44])
                try:
                    async with tx.deferred_transaction():
                        began = time.monotonic()
                        keyed_scope = {**scope, _SCOPE_KEY: context, "extensions": _held(scope)}
                        await self.app(keyed_scope, replayed_body, capture)
                        self.durations.observe(scope["path"], time.monotonic() - began)
                        if start is None:
                            raise _Unstored("the endpoint sent no response")
                        if start["status"] >= 500:
                            raise _Unstored(f"the endpoint answered {start['status']}")
                        if start["status"] in self.unstored_statuses:
                            raise _Forgotten(f"the endpoint answered {start['status']}")
                        stored = _stored(start, b"".join(chunks))
                        why = unsendable(stored.status, stored.body)
                        if why is not None:  # sent as it came; kept, it would fail every replay
                            raise _Unstored(f"the endpoint's answer cannot be replayed: {why}")
                        if tx.in_transaction:
                            await keyed.complete(self.store, tx, claim.key, fence, stored)
                        else:
                            await self._shared.complete(claim.key, fence, stored)
                except (Exception, asyncio.CancelledError) as exc:
                    # A cancelled request (the client hung up, a timeout) committed nothing.
                    failure = exc
            if isinstance(failure, LeaseLost):
                detail = "a newer attempt took this key over; this one was rolled back"
                return _problem(409, "lease-lost", "Request superseded", detail, retry_after=1)
            if isinstance(failure, _Forgotten):
                await asyncio.shield(keyed.forget(self.store, claim.key, fence))
            elif failure is not None:
                # Given back at once, a cancelled attempt too (so that the client's retry is not
                # told "in progress" until the lease runs out); shielded from a second
                # cancellation. Described without the values a driver's text carries.
                await asyncio.shield(keyed.release(self.store, claim.key, fence, describe(failure)))
                if not isinstance(failure, _Unstored) or start is None:
                    raise failure
            else:
                self._remember(claim, stored, arrived + self.ttl)
        assert start is not None
        # The first answer, exactly as the endpoint sent it; without a promise of trailers that
        # were not stored (a server would wait for them).
        await send({k: v for k, v in start.items() if k != "trailers"})
        await send({"type": "http.response.body", "body": b"".join(chunks)})
        return None

    def _remember(self, claim: Claim, stored: StoredResponse, expires: float) -> None:
        if self._cache is not None:
            self._cache.put(claim.key, claim.payload_hash, stored, expires)

    def _mismatch(self) -> Response:
        logger.warning("ALERT: Idempotency-Key reused with a different request")
        detail = "this Idempotency-Key was already used with a different request"
        return _problem(422, "key-reused", "Idempotency-Key reused", detail)

    def _in_flight(self, receipt: Receipt | None, path: str) -> Response:
        """409 with a Retry-After of when the first request most likely ends: how long this
        route usually takes, less how long it has run, within its lease (at least 1 s)."""
        wait = (
            1
            if receipt is None
            else self.durations.retry_after(
                path, receipt.now - receipt.claimed_at, receipt.lease_until - receipt.now
            )
        )
        detail = "a request with this Idempotency-Key is still being processed; retry later"
        return _problem(409, "in-flight", "Request in progress", detail, retry_after=wait)


def _fingerprint(scope: Scope, body: bytes, path: bytes | None = None) -> bytes:
    """sha256 of method, path (``scope["path"]`` unless given), query and the body; a JSON body
    is normalized first (sorted keys, no insignificant whitespace, numbers by their exact
    value), so a re-serialized retry still matches and another amount never does."""
    try:
        _, normalized_body = normalized(body)  # numbers by their exact value (_payload.py)
    except NotJSON:
        normalized_body = raw_form(body)
    if path is None:
        path = scope["path"].encode()
    h = hashlib.sha256()
    for part in (scope["method"].encode(), path, scope["query_string"]):
        h.update(len(part).to_bytes(8, "big") + part)
    h.update(normalized_body)
    return h.digest()


# Server extensions whose messages carry part of the answer outside http.response.body (a file
# sent by its path or descriptor, trailers): an endpoint told of them answered with an empty
# stored body, or promised trailers nobody sends. A keyed endpoint is not told of them.
_UNSTORABLE = frozenset(
    {"http.response.pathsend", "http.response.zerocopysend", "http.response.trailers"}
)


def _held(scope: Scope) -> dict[str, Any]:
    """The scope's extensions less those whose answer could not be held and stored."""
    extensions = scope.get("extensions") or {}
    return {name: v for name, v in extensions.items() if name not in _UNSTORABLE}


def _stored(start: Message, body: bytes) -> StoredResponse:
    content_type = ""
    kept: list[tuple[str, str]] = []
    for name, value in start.get("headers", []):
        lowered = bytes(name).lower()
        if lowered == b"content-type":
            content_type = bytes(value).decode("latin-1")
        elif lowered not in _NOT_STORED:
            kept.append((bytes(name).decode("latin-1"), bytes(value).decode("latin-1")))
    return StoredResponse(int(start["status"]), content_type, body, tuple(kept))


def _unavailable(exc: StoreUnavailable) -> Response:
    if isinstance(exc, StoreMisconfigured | StoreReadOnly):
        # Not a blip that passes by itself: say what to fix, on every request it refuses.
        logger.error("ALERT: Idempotency-Key request refused with 503: %s", exc)
    else:
        logger.warning("Idempotency-Key request refused with 503: the store is %s", exc.kind)
    detail = "the idempotency store is unavailable; retry the request with the same key"
    return _problem(503, "store-unavailable", "Service unavailable", detail, retry_after=1)


async def principal_of(principal: Principal, scope: Scope) -> str | None:
    """Whose key this is, from the application's ``principal(scope)``: a non-empty string, else
    None (logged: keyed under ``str()`` of anything else, clients would share keys, or a key
    would never match its retry)."""
    who = principal(scope)
    if inspect.isawaitable(who):
        who = await who
    if isinstance(who, str) and who:
        return who
    logger.error(
        "ALERT: principal() returned %s, not a non-empty string naming who sent the request; "
        "the request was refused (500) before anything was stored",
        "an empty string" if who == "" else f"a {type(who).__name__}",
    )
    return None


def _problem(
    status: int, code: str, title: str, detail: str, *, retry_after: int | None = None
) -> Response:
    """An RFC 9457 problem details answer."""
    headers = None if retry_after is None else {"retry-after": str(retry_after)}
    body = {
        "type": f"urn:receiver:idempotency:{code}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    return Response(orjson.dumps(body), status, headers=headers, media_type=_PROBLEM)


_NO_PRINCIPAL = _problem(
    500,
    "no-principal",
    "Server misconfigured",
    "the server could not tell who sent this request; nothing was stored",
)
