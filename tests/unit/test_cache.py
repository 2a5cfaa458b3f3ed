"""The replay cache: bounded, least recently used first, never past a receipt's expiry."""

from receiver._ledger.cache import ReplayCache
from receiver._ledger.receipts import Key, StoredResponse

ANSWER = StoredResponse(200, "application/json", b"{}")


def key(n: int) -> Key:
    return Key("p", f"msg_{n}")


def test_least_recently_used_goes_first() -> None:
    cache = ReplayCache(2)
    cache.put(key(1), b"h", ANSWER, 100)
    cache.put(key(2), b"h", ANSWER, 100)
    assert cache.get(key(1), 0) is not None  # 1 is now the most recent
    cache.put(key(3), b"h", ANSWER, 100)
    assert cache.get(key(2), 0) is None
    assert cache.get(key(1), 0) is not None
    assert cache.get(key(3), 0) is not None
    assert len(cache) == 2


def test_expired_entries_are_forgotten() -> None:
    cache = ReplayCache(10)
    cache.put(key(1), b"h", ANSWER, 100)
    assert cache.get(key(1), 99.9) is not None
    assert cache.get(key(1), 100) is None
    assert len(cache) == 0


def test_large_answers_are_not_kept() -> None:
    cache = ReplayCache(10, max_body=10)
    cache.put(key(1), b"h", StoredResponse(200, "text/plain", b"x" * 11), 100)
    assert cache.get(key(1), 0) is None
