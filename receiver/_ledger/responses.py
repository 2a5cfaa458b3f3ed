"""Turning handler results into stored answers, and stored answers into HTTP responses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

from .receipts import StoredResponse
from .results import Encoder, NotStorable, dumps

JSON = "application/json"

OK = StoredResponse(200, JSON, b'{"status":"ok"}')
IGNORED = StoredResponse(200, JSON, b'{"status":"ignored"}')


def json_response(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(body), status, headers=headers, media_type=JSON)


def error(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    """The receiver's own error answers: a short JSON object naming what failed."""
    return json_response(status, {"error": code, "detail": detail}, headers)


def stored_error(status: int, code: str, detail: str) -> StoredResponse:
    return StoredResponse(status, JSON, orjson.dumps({"error": code, "detail": detail}))


def encode(result: Any, encoder: Encoder | None = None) -> StoredResponse:
    """What a handler returned, as the answer to store: None, a JSON-able value (see
    :mod:`receiver._ledger.results`; NotStorable if it is not one), or a Starlette Response with a
    body that HTTP can carry (NotStorable for a stream, an informational status, or a body on a
    204 or 304: none of them can be stored and replayed)."""
    if result is None:
        return OK
    if isinstance(result, Response):
        _check_replayable(result)
        content_type = result.headers.get("content-type", "")
        kept = tuple(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in result.raw_headers
            if name.lower() not in NOT_STORED
        )
        return StoredResponse(result.status_code, content_type, bytes(result.body), kept)
    return StoredResponse(200, JSON, dumps(result, encoder))


def _check_replayable(result: Response) -> None:
    """Refuse an answer that no server can send as it would be stored: every redelivery would
    get it again (a broken connection, each time, for as long as the window lasts)."""
    kind = type(result).__name__
    if not hasattr(result, "body"):
        raise NotStorable(
            kind,
            f"handlers must return a Response with a body, not {kind}: a stream cannot be "
            "stored for replay",
        )
    why = unsendable(result.status_code, result.body)
    if why is not None:
        body = " with a body" if result.body else ""
        raise NotStorable(f"{kind} {result.status_code}{body}", why)


def unsendable(status: int, body: bytes | memoryview) -> str | None:
    """Why HTTP cannot carry a final answer of ``status`` with ``body``; None if it can. A
    server given one fails the answer: stored, it would fail every replay too."""
    if status < 200:
        return f"an answer is final: its status is 200 or more, not {status}"
    if status in NO_BODY and body:
        return f"a {status} answer carries no body: send it without content, or another status"
    return None


# Statuses HTTP sends without a body.
NO_BODY = frozenset({204, 304})

# Headers that describe one transfer or that the receiver sets itself, never the answer:
# everything else a handler sets (Retry-After, Location, its own) is stored and replayed.
NOT_STORED = frozenset(
    {
        b"content-type",  # stored on its own
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"date",
        b"server",
        b"idempotent-replayed",
    }
)


def replay(stored: StoredResponse, *, replayed: bool) -> Response:
    """The stored answer as a response: status, body, content type and the handler's headers,
    in their stored order, byte for byte."""
    response = Response(stored.body, stored.status)
    raw = response.raw_headers  # content-length, computed from the body
    if stored.content_type:
        raw.append((b"content-type", stored.content_type.encode("latin-1")))
    raw.extend((n.encode("latin-1"), v.encode("latin-1")) for n, v in stored.headers)
    if replayed:
        raw.append((b"idempotent-replayed", b"true"))
    return response
