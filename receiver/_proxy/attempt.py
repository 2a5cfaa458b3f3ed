"""What the proxy keeps of a keyed request, and what it hands to ``reconcile``.

The ledger row's request body holds the request as the upstream got it, minus its headers
(credentials never go into the ledger): method, path, query and body, so that the sweeper can
reconcile an attempt nobody retries. The ASGI scope of a forwarded request carries a
:class:`ProxiedRequest` (``proxied_request(scope)``), as the middleware's ``idempotent_request``
does for an endpoint.
"""

from __future__ import annotations

import dataclasses
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
from .._ledger.receipts import Key, Receipt, StoredResponse
from .._ledger.responses import NOT_STORED
from .._ledger.results import RunAgain

SCOPE_KEY = "receiver.proxy"
#: ProxyAttempt.interruption's values.
TIMEOUT, CONNECTION_LOST, UPSTREAM_ERROR, PROXY_STOPPED = (
    "timeout",
    "connection_lost",
    "upstream_error",
    "proxy_stopped",
)
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
    in ``body``, or by ``upstream_key`` if the upstream records it. ``interruption``, ``status``,
    ``began`` and ``age`` say how the attempt ended and how long ago it was forwarded: an
    upstream that got no answer back to the proxy may still be working on it, so a lookup that
    finds nothing right after a timeout does not mean it did not act."""

    method: str
    path: str
    query: str
    body: bytes
    key: str
    principal: str
    upstream_key: str
    client: httpx.AsyncClient
    interruption: str = PROXY_STOPPED
    """How the attempt ended: ``"timeout"`` (no answer within the proxy's ``timeout``: the
    upstream may still be working on it), ``"connection_lost"`` (the connection broke after the
    request went out: the same), ``"upstream_error"`` (the upstream answered ``status``, a 5xx:
    it was done with the request, and may have acted before it failed), or ``"proxy_stopped"``
    (the proxy died, was stopped or failed before the answer was stored: the upstream may have
    answered, or may still be working on it)."""
    status: int | None = None
    """The upstream's 5xx status when ``interruption`` is ``"upstream_error"``, else None."""
    began: float = 0.0
    """When the interrupted attempt was forwarded: epoch seconds, by the ledger's clock."""
    age: float = 0.0
    """Seconds from ``began`` to this call of ``reconcile``, by the ledger's clock: how long the
    upstream has had to finish with the request."""

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


@dataclass(frozen=True, slots=True)
class Interrupted:
    """How the last attempt that forwarded a key ended (ProxyAttempt's fields of that name)."""

    interruption: str
    status: int | None
    began: float


def interrupted(receipt: Receipt, error: str | None) -> Interrupted:
    """How the attempt ``receipt`` holds ended, from the error its fence recorded (None: none,
    its proxy stopped). A fence taken to reconcile an attempt carries that attempt's record in
    its envelope (:func:`carrying`), and never forwards: a reconcile that answers RUN_AGAIN
    gives it back, and the request is forwarded under a fence of its own."""
    head = orjson.loads((receipt.request_body or b"{}").partition(b"\n")[0])
    carried = head.get("interrupted")
    if isinstance(carried, dict):
        return Interrupted(carried["interruption"], carried["status"], carried["began"])
    kind = (error or "").removeprefix("upstream: ")
    status = None
    if kind == "timeout":
        interruption = TIMEOUT
    elif kind in ("read", "write"):
        interruption = CONNECTION_LOST
    elif kind.startswith("upstream ") and kind[9:].isdigit():
        interruption, status = UPSTREAM_ERROR, int(kind[9:])
    else:  # none recorded (a proxy that died), a cancellation, the forwarding step's own error
        interruption = PROXY_STOPPED
    # The claim is taken right before the request is forwarded.
    return Interrupted(interruption, status, receipt.claimed_at)


def carrying(stored: bytes, record: Interrupted) -> bytes:
    """The envelope ``stored`` with ``record`` in it, for the fence that reconciles it."""
    head, _, body = stored.partition(b"\n")
    meta = {**orjson.loads(head), "interrupted": dataclasses.asdict(record)}
    return orjson.dumps(meta) + b"\n" + body


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
