"""The unsigned delivery id a sender sends beside a key made from what it signs (Linear's
``Linear-Delivery``): never the key (Linear documents no rule that keeps it on a retry), only a
hint. The same key arriving under another hint is a captured delivery re-sent under a new id,
or a sender that repeats signed content under new ids: either way the ledger answers it from
the first receipt, and the key-drift alert says it happened.

Remembered per process, for the most recent keys only (bounded): an alert, never a decision.
"""

from __future__ import annotations

from collections import OrderedDict

from .._ledger.receipts import Key

#: Keys remembered with their first hint.
SIZE = 10_000


class Hints:
    """The first hint seen per key, for the :data:`SIZE` most recent keys."""

    __slots__ = ("_seen", "size")

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._seen: OrderedDict[Key, str] = OrderedDict()

    def changed(self, key: Key, hint: str) -> bool:
        """Whether ``key`` came before under another hint (remembering this one if it is new)."""
        first = self._seen.get(key)
        if first is None:
            self._seen[key] = hint
            if len(self._seen) > self.size:
                self._seen.popitem(last=False)
            return False
        return first != hint
