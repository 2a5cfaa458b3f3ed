"""Turning handler results into stored answers, and stored answers into HTTP responses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

from ._ledger import StoredResponse

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


def encode(result: Any) -> StoredResponse:
    """What a handler returned, as the answer to store: None, a JSON-able value, or a Starlette
    Response with a body (a streaming response cannot be stored and replayed)."""
    if result is None:
        return OK
    if isinstance(result, Response):
        if not hasattr(result, "body"):
            raise TypeError(
                f"handlers must return a Response with a body, not {type(result).__name__}: "
                "a stream cannot be stored for replay"
            )
        content_type = result.headers.get("content-type", "application/octet-stream")
        return StoredResponse(result.status_code, content_type, bytes(result.body))
    return StoredResponse(200, JSON, orjson.dumps(result))


def replay(stored: StoredResponse, *, replayed: bool) -> Response:
    headers = {"content-type": stored.content_type}
    if replayed:
        headers["idempotent-replayed"] = "true"
    return Response(stored.body, stored.status, headers=headers)
