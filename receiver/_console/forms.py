"""The console's forms: an urlencoded body read with a bound, and the refusal of one that names
nothing the console can act on."""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request

from .._exceptions import ReceiverError

#: The largest form accepted (a re-run's pasted payload is the big one).
MAX_FORM = 2 * 1024 * 1024


class BadRequest(ReceiverError):
    """The request names nothing the console can act on (answered 400)."""


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, bounded in size (no multipart: the console's forms never upload)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise BadRequest(f"the form is larger than {MAX_FORM} bytes")
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode(), keep_blank_values=True, max_num_fields=50, strict_parsing=False
        )
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the form is not valid urlencoded UTF-8") from None
    if any("\x00" in v for _, v in pairs):
        raise BadRequest("a form field holds a NUL character, which the ledger cannot store")
    return dict(pairs)
