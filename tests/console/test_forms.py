"""The console's form reader: each way a form can be wrong is a BadRequest (a 400 that names
it), a client that leaves mid-form included, which would otherwise be logged as a crash."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.types import Message

from receiver._console.forms import MAX_FIELDS, BadRequest, read_form

FORM = b"application/x-www-form-urlencoded"


def request(*chunks: bytes, leaves: bool = False) -> Request:
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": leaves or i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    if leaves:
        messages.append({"type": "http.disconnect"})

    async def receive() -> Message:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", FORM)]}
    return Request(scope, receive)


async def test_a_form_is_read_into_its_fields() -> None:
    got = await read_form(request(b"reason=back&", b"operator=Ada+L"))
    assert got == {"reason": "back", "operator": "Ada L"}


@pytest.mark.parametrize(
    ("form", "leaves", "says"),
    [
        (b"reason=back", True, "left before its form was read"),
        (b"&".join(b"f%d=1" % n for n in range(MAX_FIELDS + 1)), False, "more than 50 fields"),
        (b"reason=\xff", False, "not valid urlencoded UTF-8"),
        (b"reason=a%00b", False, "NUL"),
    ],
)
async def test_a_form_that_cannot_be_read_is_a_bad_request_that_says_why(
    form: bytes, leaves: bool, says: str
) -> None:
    with pytest.raises(BadRequest, match=says):
        await read_form(request(form, leaves=leaves))
