"""An agent's action as the executor keys it: the registered :class:`Tool`, the proposed
:class:`Action` with its key and fingerprint, what a tool is called with, and its stored result.

The key is built from a scope and an id the system assigned (:func:`action_key`), never from
the model's words; the fingerprint is a hash of the normalized request (:func:`fingerprint`),
so a retry that rewords a volatile field is still the same action, and the same key with
another request is a conflict, never a second write.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from .._exceptions import ActionError
from .._store.base import Connection

Effects = Literal["transactional", "external"]
ToolFunc = Callable[["ToolCall", Connection], Awaitable[Any]]
ReconcileFunc = Callable[["ToolCall"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A registered tool. ``effects="transactional"`` promises it acts only through ``tx``;
    ``"external"`` tools call the outside world and are reconciled, never re-run blindly."""

    name: str
    func: ToolFunc
    effects: Effects = "transactional"
    reconcile: ReconcileFunc | None = None
    volatile: frozenset[str] = frozenset()
    lease: float | None = None


@dataclass(frozen=True, slots=True)
class Action:
    """A proposed action with its stable key, assigned before the first call. Persist it (or
    its ``scope`` and ``action_id``) with the agent's state and execute it as often as needed."""

    tool: str
    scope: str
    action_id: str
    version: int
    key: str
    request: Mapping[str, Any]
    fingerprint: bytes


@dataclass(frozen=True, slots=True)
class ToolCall:
    """What a tool is called with."""

    action: Action
    fence: int
    #: Pass it to the downstream API's own idempotency key (Stripe's ``Idempotency-Key``):
    #: stable per action and the same on every attempt, so the downstream dedups a re-run.
    downstream_key: str
    turn: str | None = None

    @property
    def request(self) -> Mapping[str, Any]:
        return self.action.request


# Twenty digits in a row: orjson reads an integer that long as a float, losing digits.
_LONG_DIGITS = re.compile(rb"\d{20}")


@dataclass(frozen=True, slots=True)
class ActionResult:
    """The stored result of an action: ``body`` is the bytes stored by the first attempt."""

    key: str
    body: bytes
    replayed: bool

    @property
    def value(self) -> Any:
        if _LONG_DIGITS.search(self.body):  # maybe an integer past 64 bits: read exactly
            return json.loads(self.body)
        return orjson.loads(self.body)


def action_key(scope: str, tool: str, action_id: str, version: int = 1) -> str:
    """``tenant:action:object:v1``; each part percent-encoded, so no two differ only by where
    a colon falls."""
    parts = [urllib.parse.quote(p, safe="") for p in (scope, tool, action_id)]
    return ":".join([*parts, f"v{version}"])


def downstream_key(key: str) -> str:
    """The key passed downstream: derived from the action key only (not the fence), so every
    attempt of one action sends the same one, and it reveals nothing of the scope."""
    return "rcv_" + hashlib.sha256(b"receiver-downstream\x00" + key.encode()).hexdigest()[:40]


def fingerprint(request: Mapping[str, Any], volatile: Iterable[str] = ()) -> bytes:
    """sha256 of the normalized request: sorted keys, trimmed strings, volatile fields (names,
    or dotted paths such as ``"meta.generated_at"``) dropped, and numbers by their decimal value
    (``1200`` and ``1200.0`` are one number, as in a webhook payload's fingerprint)."""
    dropped = [tuple(v.split(".")) for v in volatile]
    try:
        text = orjson.dumps(_normalize(request, dropped, ()), option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise ActionError(f"the action's request is not JSON: {exc}") from exc
    except RecursionError:
        raise ActionError("the action's request is nested too deeply to be JSON") from None
    return hashlib.sha256(text).digest()


def _normalize(value: Any, dropped: list[tuple[str, ...]], path: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, Mapping):
        for k in value:
            if not isinstance(k, str):
                # str(k) made {1: "a", "1": "b"} one field, fingerprinted on one of its values,
                # and the request was refused only when executed (orjson takes string keys).
                where = ".".join(path) or "the request"
                raise ActionError(
                    f"the action's request has a {type(k).__name__} key at {where}: "
                    "JSON object keys are strings"
                )
        return {
            k: _normalize(v, dropped, (*path, k))
            for k, v in value.items()
            if (*path, k) not in dropped
        }
    if isinstance(value, list | tuple):
        return [_normalize(v, dropped, path) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or infinity (orjson writes null): kept, it would replay as None.
        where = ".".join(path) or "the request"
        raise ActionError(f"the action's request holds NaN or an infinity at {where}: not JSON")
    if isinstance(value, float) and value.is_integer():
        # A float's value is the decimal its shortest text gives back (what the JSON it was read
        # from said); an integral one is that integer, where a 64-bit integer holds it.
        number = int(value) if abs(value) <= 2**53 else int(decimal.Decimal(repr(value)))
        return number if -(2**63) <= number < 2**64 else value
    return value


def tool_of(key: str) -> str:
    """The tool's name in an action key (``scope:tool:object:v1``, each part percent-encoded)."""
    parts = key.split(":")
    if len(parts) != 4 or not parts[3].startswith("v"):
        raise ActionError(f"{key!r} is not an action key (scope:tool:object:vN)")
    return urllib.parse.unquote(parts[1])


def request_body(request: Mapping[str, Any]) -> bytes:
    """The request as kept in the ledger until completion, for the sweeper's recovery."""
    try:
        return orjson.dumps(request)
    except TypeError as exc:
        raise ActionError(f"the action's request is not JSON: {exc}") from exc
