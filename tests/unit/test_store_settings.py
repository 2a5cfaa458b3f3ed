"""A store's settings are checked where they are given (receiver/_store/settings.py): a pool
size or a timeout of the wrong type, a bool, NaN, infinity or a size no database serves is a
ConfigurationError when the store is built, not a failure on first use (``max_size=2**70``
exhausted memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from receiver import ConfigurationError, PostgresStore, SQLiteStore

DSN = "postgresql://app@localhost/app"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"max_size": 2**70}, "max_size must be a whole number of connections from 1 to 10000"),
        ({"max_size": 0}, "max_size"),
        ({"max_size": "10"}, "max_size"),
        ({"max_size": 10.0}, "max_size"),
        ({"max_size": True}, "max_size"),
        ({"min_size": -1}, "min_size"),
        ({"min_size": None}, "min_size"),
        ({"min_size": 20, "max_size": 10}, r"min_size \(20\) is more than max_size \(10\)"),
        ({"acquire_timeout": float("nan")}, "acquire_timeout must be seconds above 0"),
        ({"acquire_timeout": float("inf")}, "acquire_timeout"),
        ({"acquire_timeout": 0}, "acquire_timeout"),
        ({"acquire_timeout": "5"}, "acquire_timeout"),
        ({"acquire_timeout": True}, "acquire_timeout"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"connect_timeout": 5000}, "at most 3600"),
        ({"batch_flushes": True}, "batch_flushes"),
    ],
)
def test_a_postgres_pool_setting_it_cannot_use_is_refused(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        PostgresStore(DSN, **options)


def test_postgres_pool_settings_within_bounds_are_kept() -> None:
    store = PostgresStore(DSN, min_size=0, max_size=10_000, acquire_timeout=1, connect_timeout=0.5)
    assert store.concurrency == 10_000


@pytest.mark.parametrize(
    ("path", "options", "says"),
    [
        (123, {}, "path \\(a str or Path\\), not int"),
        (None, {}, "not NoneType"),
        (b"ledger.db", {}, "not bytes"),
        ("", {}, "empty or holds a NUL"),
        ("led\x00ger.db", {}, "empty or holds a NUL"),
        ("ledger.db", {"busy_timeout": "5"}, "busy_timeout must be seconds 0 or more"),
        ("ledger.db", {"busy_timeout": float("nan")}, "busy_timeout"),
        ("ledger.db", {"busy_timeout": -1}, "busy_timeout"),
        ("ledger.db", {"busy_timeout": True}, "busy_timeout"),
        ("ledger.db", {"busy_timeout": 5000}, "at most 3600"),  # milliseconds, by mistake
    ],
)
def test_a_sqlite_setting_it_cannot_use_is_refused(
    tmp_path: Path, path: Any, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        SQLiteStore(path, **options)


async def test_a_sqlite_busy_timeout_of_zero_is_accepted(tmp_path: Path) -> None:
    # SQLite's own meaning: never wait for a lock.
    store = SQLiteStore(tmp_path / "ledger.db", busy_timeout=0)
    async with store, store.acquire() as conn:
        assert conn is not None


@pytest.mark.parametrize("dsn", [b"postgresql://h/db", 5])
def test_a_postgres_url_that_is_not_text_is_refused(dsn: Any) -> None:
    with pytest.raises(ConfigurationError, match="is a str"):
        PostgresStore(dsn)
