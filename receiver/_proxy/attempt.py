"""What the proxy keeps of a keyed request, and what it hands to ``reconcile``.

The ledger row's request body holds the request as the upstream got it, minus its headers
(credentials never go into the ledger): method, path, query and body, so that the sweeper can
reconcile an attempt nobody retries. The ASGI scope of a forwarded request carries a
:class:`ProxiedRequest` (``proxied_request(scope)``), as the middleware's ``idempotent_request``
does for an endpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from starlette.responses import Response
from starlette.types import Scope

from .._exceptions import ConfigurationError, ReceiverError
from .._idempotency.middleware import _problem
from .._ledger.receipts import Key, StoredResponse
from .._ledger.responses import NOT_STORED
from .._ledger.results import RunAgain

SCOPE_KEY = "receiver.proxy"
# Set-Cookie is the caller's session, not the answer (as the middleware decides).
_NOT_STORED = NOT_STORED | {b"set-cookie"}


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    """A keyed request being forwarded: the client's key, its principal, the attempt's fence,
    the key the upstream gets (``upstream_key``: the same on every attempt), and the upstream
    URL it goes to (checked once, as the request arrived)."""

    key: str
    principal: str
    fence: int
    upstream_key: str
    url: httpx.URL


def proxied_request(scope: Scope) -> ProxiedRequest | None:
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, ProxiedRequest) else None


def proxied_request_of(scope: Scope) -> ProxiedRequest:
    found = scope.get(SCOPE_KEY)
    if not isinstance(found, ProxiedRequest):
        raise ConfigurationError("the proxy's forwarding step runs only inside the proxy")
    return found


@dataclass(frozen=True, slots=True)
class ProxyAttempt:
    """An interrupted attempt, for ``reconcile(attempt)``: ask the upstream what happened
    (``client`` is the proxy's own, its base URL the upstream), for example by the business id
    in ``body``, or by ``upstream_key`` if the upstream records it."""

    method: str
    path: str
    query: str
    body: bytes
    key: str
    principal: str
    upstream_key: str
    client: httpx.AsyncClient

    def json(self) -> Any:
        return orjson.loads(self.body)


#: ``reconcile(attempt)``: the upstream's answer to store (an httpx or Starlette response), or
#: RUN_AGAIN when the upstream did not act; raising leaves the attempt for a later try.
Reconcile = Callable[[ProxyAttempt], Awaitable["httpx.Response | Response | RunAgain"]]


class NotReconciled(ReceiverError):
    """reconcile() returned something that is not an answer, or a 5xx."""


def upstream_key(key: Key) -> str:
    """The key forwarded to the upstream: stable per (proxy namespace, principal, key), so that
    an upstream that deduplicates by it sees every attempt of one request as one."""
    return "rcv_" + hashlib.sha256(f"{key.provider}\x00{key.webhook_id}".encode()).hexdigest()[:40]


def envelope(scope: Scope, body: bytes) -> bytes:
    head = {
        "method": scope["method"],
        "path": scope["path"],
        "query": bytes(scope.get("query_string", b"")).decode("latin-1"),
    }
    return orjson.dumps(head) + b"\n" + body


def unwrap(stored: bytes | None) -> tuple[str, str, str, bytes]:
    head, _, body = (stored or b"{}").partition(b"\n")
    meta = orjson.loads(head)
    return str(meta.get("method", "")), str(meta.get("path", "")), str(meta.get("query", "")), body


def stored(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> StoredResponse:
    content_type = ""
    kept: list[tuple[str, str]] = []
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-type":
            content_type = value.decode("latin-1")
        elif lowered not in _NOT_STORED:
            kept.append((name.decode("latin-1"), value.decode("latin-1")))
    return StoredResponse(status, content_type, body, tuple(kept))


def reconciled(answer: Any) -> StoredResponse:
    """What reconcile() returned, as the answer to store."""
    if isinstance(answer, httpx.Response):
        answer.read()
        result = stored(answer.status_code, list(answer.headers.raw), answer.content)
    elif isinstance(answer, Response) and hasattr(answer, "body"):
        result = stored(answer.status_code, list(answer.raw_headers), bytes(answer.body))
    else:
        raise NotReconciled(
            f"reconcile() returned a {type(answer).__name__}: return the upstream's answer (an "
            "httpx.Response or a Starlette Response) or RUN_AGAIN"
        )
    if result.status >= 500:
        raise NotReconciled(f"reconcile() returned a {result.status}: not an outcome to store")
    return result


def bad_gateway(status: int, detail: str) -> Response:
    title = "Bad gateway" if status == 502 else "Gateway timeout"
    return _problem(status, "upstream", title, detail, retry_after=1)


def passed_on(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
    """The upstream's answer as the client gets it, framed by its length."""
    response = Response(body, status)
    response.raw_headers = [
        *(h for h in headers if h[0].lower() != b"content-length"),
        (b"content-length", str(len(body)).encode()),
    ]
    return response
