"""Reading a keyed request's body before anything is claimed, shared by the Idempotency-Key
middleware and the idempotency proxy: both must hold the whole body to fingerprint it, and
both refuse one over their limit before reading the rest of it."""

from __future__ import annotations

from starlette.types import Receive


class BodyTooLarge(Exception):
    """The body exceeds the limit (answered 413; nothing was claimed)."""


class ClientGone(Exception):
    """The client disconnected before the body was complete (nobody is left to answer)."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, read from ASGI ``http.request`` messages.

    Raises :class:`BodyTooLarge` as soon as more than ``limit`` bytes have arrived, and
    :class:`ClientGone` on ``http.disconnect``.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
