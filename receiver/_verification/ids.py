"""The sender's own event ids that are not signed: read from their headers, and the keys the
same deliveries had when the ledger keyed them on the body.

GitHub's ``X-GitHub-Delivery``, Shopify's ``X-Shopify-Event-Id`` and Twilio's
``I-Twilio-Idempotency-Token`` are each sender's documented identity of an event, kept on its
retries: they are the ledger key (docs/explanation/keys.md says why, scheme by scheme). Linear's
``Linear-Delivery`` is only a hint beside a key made from the signed payload.

:func:`body_key` is the key those schemes gave before (the body's digest): receipts stored under
it keep answering their event's redeliveries (receiver/_webhooks/legacy.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._exceptions import MalformedRequest

if TYPE_CHECKING:
    from starlette.datastructures import Headers

__all__ = ["MAX_ID", "body_key", "hint", "id_header", "is_id", "legacy_key_of"]

#: Longest id header value read (a genuine one is a UUID or a number: under 64 characters).
MAX_ID = 1024
# What the ledger takes as an id: visible ASCII (RFC 5234 VCHAR), 1-255 characters.
_ID = re.compile(r"[\x21-\x7e]{1,255}")


def is_id(value: str) -> bool:
    """Whether ``value`` can be a ledger key: 1-255 visible ASCII characters."""
    return _ID.fullmatch(value) is not None


def body_key(body: bytes) -> str:
    """The ledger key of a scheme keyed on the body alone: ``"sha256:"`` and its hex digest."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def id_header(headers: Headers, names: Sequence[str]) -> str:
    """The value of the first of ``names`` the delivery carries: the sender's event id (400
    ``missing_header:<first name>`` if none is there, ``duplicate_header:<name>`` if it is
    sent twice, ``webhook_id`` if it is not 1-255 visible ASCII)."""
    for name in names:
        values = headers.getlist(name)
        if len(values) > 1:
            raise MalformedRequest(f"duplicate_header:{name}", f"{name} sent more than once")
        if values and values[0]:
            if len(values[0]) > MAX_ID or not is_id(values[0]):
                raise MalformedRequest("webhook_id", f"{name} must be 1-255 visible ASCII")
            return values[0]
    raise MalformedRequest(f"missing_header:{names[0]}", f"{names[0]} header is required")


def hint(headers: Headers, name: str) -> str | None:
    """An unsigned id header, as a hint only: its one value if it is 1-255 visible ASCII, else
    None (it decides nothing, so a bad one is not a reason to refuse the delivery)."""
    values = headers.getlist(name)
    if len(values) != 1 or not is_id(values[0]):
        return None
    return values[0]


def legacy_key_of(verifier: object, body: bytes) -> str | None:
    """The key a delivery of ``body`` had before its scheme keyed on the sender's event id, or
    None for a scheme whose key did not change (and for a provider's own ``dedup_key``)."""
    method = getattr(verifier, "legacy_key", None)
    if method is None:
        return None
    key = method(body)
    return key if isinstance(key, str) and is_id(key) else None
