"""The console's forms: an urlencoded body read with a bound, and the refusal of one that names
nothing the console can act on."""

from __future__ import annotations

import urllib.parse

from starlette.requests import ClientDisconnect, Request

from .._exceptions import ReceiverError

#: The largest form accepted (a re-run's pasted payload is the big one).
MAX_FORM = 2 * 1024 * 1024
#: More fields than any of the console's forms has.
MAX_FIELDS = 50


class BadRequest(ReceiverError):
    """The request names nothing the console can act on (answered 400)."""


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, bounded in size (no multipart: the console's forms never upload)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise BadRequest(f"the form is larger than {MAX_FORM} bytes")
    except ClientDisconnect:
        # Nobody reads the answer; a 400 keeps it out of the error log.
        raise BadRequest("the client left before its form was read") from None
    if body.count(b"&") >= MAX_FIELDS:
        raise BadRequest(f"the form has more than {MAX_FIELDS} fields")
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode(), keep_blank_values=True, max_num_fields=MAX_FIELDS, strict_parsing=False
        )
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the form is not valid urlencoded UTF-8") from None
    if any("\x00" in v for _, v in pairs):
        raise BadRequest("a form field holds a NUL character, which the ledger cannot store")
    return dict(pairs)
