"""The retention benchmark on a few thousand receipts: both sides must expire the same day's
completed receipts, keep its dead letters, and end holding the same receipts, so that its
figures compare like with like; and it must leave no scratch database behind."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import asyncpg

from benchmarks.retention import run


def test_both_sides_expire_the_same_receipts(pg_admin_url: str, tmp_path: Path) -> None:
    name = f"receiver_retention_test_{os.getpid()}"
    url = pg_admin_url.rsplit("/", 1)[0] + "/" + name
    args = argparse.Namespace(
        rows=2000,
        days=4,
        chunk=1000,
        hot=50,
        hot_rounds=1,
        pg_url=url,
        keep=False,
        out=str(tmp_path / "retention.json"),
    )
    result = asyncio.run(run(args))

    # Day 0 holds 500 receipts, every hundredth failed: 495 completed expire, 5 dead letters stay.
    today, partitioned = result["sweep"]["today"], result["sweep"]["partitioned"]
    assert today["deleted"] == partitioned["deleted"] == 495
    assert partitioned["moved_dead_letters"] == 5
    assert result["checks"] == {
        "today_rows": 1505,
        "partitioned_rows": 1505,
        "keys": 1505,
        "only_in_today": 0,
        "keys_without_body": 0,
        "ok": True,
    }

    async def exists() -> bool:
        conn = await asyncpg.connect(pg_admin_url)
        try:
            return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name))
        finally:
            await conn.close()

    assert not asyncio.run(exists())
