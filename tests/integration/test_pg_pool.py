"""PostgresStore's own pool: ``min_size`` connections opened in the background when the store
opens (it was accepted and ignored), none by default, and opening never waits for a database
that is down."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from receiver import PostgresStore


async def _size_reaches(store: PostgresStore, size: int) -> int:
    pool = store._pool
    assert pool is not None
    for _ in range(200):
        if pool.get_size() >= size:
            break
        await asyncio.sleep(0.025)
    return int(pool.get_size())


async def test_min_size_connections_are_opened_when_the_store_opens(pg_url: str) -> None:
    async with PostgresStore(pg_url, min_size=3, max_size=5) as store:
        assert await _size_reaches(store, 3) == 3
        async with store.acquire() as conn:  # the warmed connections serve as any other
            assert await conn.fetchval("SELECT 1") == 1


async def test_by_default_no_connection_is_made_before_it_is_needed(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        await asyncio.sleep(0.2)
        assert store._pool is not None
        assert store._pool.get_size() == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_database_that_is_down_does_not_stop_the_store_opening(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/nowhere"
    caplog.set_level(logging.INFO, "receiver.store")
    store = PostgresStore(url, min_size=2, connect_timeout=1)
    await store.open()  # returns at once; the warm-up fails in the background
    assert store._warming is not None
    await store._warming
    await store.close()
    warm = [r for r in caplog.records if "warm-up" in r.getMessage()]
    assert warm, caplog.records
    assert "after 0 connections" in warm[0].getMessage()
