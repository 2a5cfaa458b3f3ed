"""A bounded per-process cache of completed receipts, so that replays cost no round trip.

A completed receipt never changes until it expires (nothing but expiry touches it): the
stored answer is the truth for its whole window. So each process may keep the ones it has seen
and answer redeliveries (and same-id mismatches) from memory. Only completed receipts are kept:
a failed one can be reopened by an operator's replay. Large answers are not kept, and the least
recently used entry goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .receipts import Key, StoredResponse


@dataclass(frozen=True, slots=True)
class Cached:
    payload_hash: bytes  # of the normalized payload, as in the ledger
    response: StoredResponse
    expires_at: float
    #: sha256 of the exact body this process saw: a byte-identical redelivery (the usual case)
    #: is recognised before the body is parsed at all.
    body_hash: bytes = b""
    #: For the log line of a replay from memory (the body is not parsed then).
    event_type: str | None = None


class ReplayCache:
    def __init__(self, size: int = 10_000, *, max_body: int = 64 * 1024) -> None:
        self.size = size
        self.max_body = max_body
        self._entries: OrderedDict[Key, Cached] = OrderedDict()

    def get(self, key: Key, now: float) -> Cached | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= now:
            # Expired: the ledger forgets it too, and a redelivery is a new event.
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def put(
        self,
        key: Key,
        payload_hash: bytes,
        response: StoredResponse,
        expires_at: float,
        body_hash: bytes = b"",
        event_type: str | None = None,
    ) -> None:
        if len(response.body) > self.max_body:
            return
        self._entries[key] = Cached(payload_hash, response, expires_at, body_hash, event_type)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry (the ledger still has them)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
