"""Where a provider's dedup key comes from: the scheme's own id, a path into the payload, or a
function of the verified delivery.

The ledger deduplicates on ``(provider, id)``. By default the id is the one the scheme defines
(``webhook-id``, Stripe's event id, ``X-GitHub-Delivery``, ...). Some senders mint a new id on
every retry, and then that id deduplicates nothing: :class:`KeyedVerifier` replaces it, after
the signature verified, with an id read from the signed payload (``("record.id",
"commit_timestamp")``) or computed by a function. The provider's name stays the first half of
the key, so keys are always scoped by route: two paths are two providers, with two key spaces.

The key never changes what is fingerprinted: the payload hash still sits beside the key, so the
same key with another payload is still a mismatch (422), whatever the key is made of.

A key is made from its parts like this: each part is a string, an integer or a boolean; a
number without a fraction counts as the integer it is (``1200.0`` is ``1200``: serializers
differ in writing it, the value does not), one with a fraction is refused (its text varies with
the sender's serializer); when every part is visible ASCII without ``"|"`` and the whole fits
255 characters, the key is the parts joined with ``"|"`` (``"42|2026-05-01T10:00:00Z"``, readable
in logs and in ``receiver failed``); otherwise it is ``"sha256||"`` and the hex digest of the
parts as a JSON list, which no readable key can equal (a readable key never holds an empty
part, so never ``"||"``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.datastructures import Headers

from .._exceptions import ConfigurationError, MalformedRequest
from .payload import _form, attempt_field_of
from .verifier import VerifiedDelivery, Verifier

__all__ = [
    "DedupKey",
    "KeySource",
    "KeyedVerifier",
    "VerifiedBody",
    "dedup_key",
    "key_from_parts",
    "key_of",
]

# What the ledger and the other schemes accept as an id: visible ASCII, at most 255 characters.
_READABLE = re.compile(r"[\x21-\x7b\x7d\x7e]{1,255}")  # no "|" inside a part
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
_PATH = re.compile(r"[^.\s]+(\.[^.\s]+)*")
_MAX_PATHS = 8


@dataclass(frozen=True, slots=True)
class VerifiedBody:
    """What a key function sees: the scheme's verified delivery, the parsed payload and the
    request headers (for a header the scheme does not sign: beware, anyone can set it)."""

    delivery: VerifiedDelivery
    payload: Any
    headers: Headers


#: A key function: returns a string, an integer, or a tuple of them (joined as above).
KeyFunction = Callable[[VerifiedBody], object]
#: What ``Provider(dedup_key=...)`` accepts: None (the scheme's id), one dotted path into the
#: payload, a list of paths, or a function of the verified delivery.
KeySource = str | Sequence[str] | KeyFunction | None


def key_from_parts(parts: Sequence[object], what: str) -> str:
    """The key made of ``parts`` (see the module docstring); MalformedRequest if a part is
    missing, null, a number with a fraction, an object or a list."""
    texts: list[str] = []
    for index, part in enumerate(parts):
        if isinstance(part, bool):
            texts.append("true" if part else "false")
        elif isinstance(part, int):
            texts.append(str(part))
        elif isinstance(part, float) and part.is_integer():  # never NaN or an infinity
            texts.append(str(int(part)))
        elif isinstance(part, str) and part:
            texts.append(part)
        else:
            name = what if len(parts) == 1 else f"{what} part {index + 1}"
            raise MalformedRequest(
                "dedup_key",
                f"{name} is {_kind(part)}: a key part must be a non-empty string or integer",
            )
    if all(_READABLE.fullmatch(text) for text in texts):
        joined = "|".join(texts)
        if len(joined) <= 255:
            return joined
    return "sha256||" + hashlib.sha256(orjson.dumps(texts)).hexdigest()


def _kind(part: object) -> str:
    """What a part that cannot be a key part is, for the refusal (never its value)."""
    if part is None:
        return "missing"
    if part == "":
        return "empty"
    return "not a whole number" if isinstance(part, float) else type(part).__name__


def _parsed(body: bytes) -> Any:
    """The JSON payload (integers beyond 64 bits through the standard library), or a form's
    (Twilio's) as the handlers see it, or None."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # also invalid UTF-8
            form = _form(body)
            return None if form is None else form[0]


def _lookup(payload: Any, path: str) -> Any:
    """The value at a dotted path (``"record.id"``; a list index is a number: ``"items.0"``),
    or None where the path leads nowhere."""
    value = payload
    for step in path.split("."):
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return None
    return value


class DedupKey:
    """How one provider's key is made from a verified delivery; see :func:`dedup_key`."""

    __slots__ = ("function", "paths")

    def __init__(self, paths: tuple[str, ...] = (), function: KeyFunction | None = None) -> None:
        self.paths = paths
        self.function = function

    def key(self, delivery: VerifiedDelivery, body: bytes, headers: Headers) -> str:
        payload = _parsed(body)
        if self.function is None:
            if not isinstance(payload, dict):
                raise MalformedRequest("dedup_key", "the body is not a JSON object or a form")
            return key_from_parts([_lookup(payload, p) for p in self.paths], self._named())
        try:
            made = self.function(VerifiedBody(delivery, payload, headers))
        except Exception as exc:  # a user's function on a sender's payload: a refusal, not a 500
            # The type only: its message may quote payload values.
            raise MalformedRequest(
                "dedup_key", f"the dedup key function raised {type(exc).__name__}"
            ) from None
        parts = list(made) if isinstance(made, tuple | list) else [made]
        if not parts:
            raise MalformedRequest("dedup_key", "the dedup key function returned no parts")
        key = key_from_parts(parts, "the dedup key function's result")
        if _KEY.fullmatch(key) is None:  # pragma: no cover - key_from_parts always gives one
            raise MalformedRequest("dedup_key", "the dedup key is not 1-255 visible ASCII")
        return key

    def _named(self) -> str:
        return "payload " + ", ".join(self.paths)

    def describe(self) -> str:
        """For ``repr`` and ``receiver ttl``: where the key comes from."""
        if self.function is not None:
            return getattr(self.function, "__qualname__", "function")
        return "payload:" + ",".join(self.paths)


def dedup_key(source: KeySource, provider: str) -> DedupKey | None:
    """Check a ``dedup_key=`` setting at start-up: None keeps the scheme's id."""
    if source is None:
        return None
    if callable(source):
        # The key is read while the delivery is verified, which is synchronous: an async
        # function's coroutine is no key, so every delivery would be refused (400) for good.
        call = type(source).__call__  # an instance's own, for an object with async __call__
        if inspect.iscoroutinefunction(source) or inspect.iscoroutinefunction(call):
            raise ConfigurationError(
                f"provider {provider!r}: dedup_key must be a plain function (def, not async "
                "def): it is called while the delivery is verified, with nothing to await"
            )
        return DedupKey(function=source)
    paths: Sequence[object] = [source] if isinstance(source, str) else source
    if isinstance(source, bytes) or not isinstance(paths, Sequence) or not paths:
        raise ConfigurationError(
            f"provider {provider!r}: dedup_key must be a dotted path into the payload "
            '("record.id"), a list of paths, or a function of the verified delivery'
        )
    if len(paths) > _MAX_PATHS:
        raise ConfigurationError(f"provider {provider!r}: dedup_key lists more than 8 paths")
    for path in paths:
        if not isinstance(path, str) or _PATH.fullmatch(path) is None:
            raise ConfigurationError(
                f"provider {provider!r}: dedup_key path {path!r} is not a dotted path such "
                'as "record.id" (names separated by ".", no spaces)'
            )
    return DedupKey(paths=tuple(str(p) for p in paths))


class KeyedVerifier:
    """A scheme's verifier whose delivery id is replaced by the provider's dedup key."""

    __slots__ = ("inner", "key")

    def __init__(self, inner: Verifier, key: DedupKey) -> None:
        self.inner = inner
        self.key = key

    def verify(self, headers: Headers, body: bytes, now: float) -> VerifiedDelivery:
        verified = self.inner.verify(headers, body, now)  # the signature first, always
        made = self.key.key(verified, body, headers)
        return VerifiedDelivery(made, verified.timestamp, verified.event_type, verified.hint)

    def key_of(self, body: bytes, sender_id: str) -> str:
        """The key of a delivery the caller vouches for: the scheme's, then the dedup key made
        from it and the body (a key function sees no headers: there were none)."""
        inner = VerifiedDelivery(key_of(self.inner, body, sender_id), None)
        return self.key.key(inner, body, Headers())

    @property
    def stop_retry(self) -> tuple[tuple[str, str], ...]:
        return stop_retry_of(self.inner)

    @property
    def attempt_field(self) -> str | None:
        """The inner scheme's per-attempt field (the key changes nothing of the fingerprint)."""
        return attempt_field_of(self.inner)

    def __repr__(self) -> str:
        return f"{self.inner!r} keyed by {self.key.describe()}"


def key_of(verifier: Verifier, body: bytes, sender_id: str) -> str:
    """The ledger key a live delivery of ``body`` gets from ``verifier``, for a delivery that
    did not come through it (``Receiver.enqueue_many``): the sender's event id, read from the
    signed body where the sender puts it there (Stripe, Slack, Paddle, Zoom, Linear), else
    ``sender_id``, the id the sender put in its header (Standard Webhooks' webhook-id, GitHub's
    delivery GUID, Shopify's event id, Twilio's token), as it was live. A verifier of the
    user's own that cannot say (no ``key_of``) keys on ``sender_id`` too."""
    method = getattr(verifier, "key_of", None)
    if method is None:
        return sender_id
    key = method(body, sender_id)
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise MalformedRequest("dedup_key", "the key is not 1-255 visible ASCII")
    return key


def stop_retry_of(verifier: object) -> tuple[tuple[str, str], ...]:
    """The headers that tell this verifier's sender not to retry a delivery (none for a
    sender that documents no such answer, or for a verifier of the user's own)."""
    headers = getattr(verifier, "stop_retry", ())
    if not isinstance(headers, tuple):
        return ()
    return tuple((str(name), str(value)) for name, value in headers if isinstance(name, str))
