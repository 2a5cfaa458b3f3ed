"""The retention benchmark on a few thousand receipts: both sides must expire the same day's
completed receipts, keep its dead letters, and end holding the same receipts, so that its
figures compare like with like; and it must leave no scratch database behind."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from benchmarks.retention import run


def _args(pg_admin_url: str, tmp_path: Path, **overrides: Any) -> argparse.Namespace:
    name = f"receiver_retention_test_{os.getpid()}"
    return argparse.Namespace(
        **{
            "rows": 2000,
            "days": 4,
            "chunk": 1000,
            "hot": 50,
            "hot_rounds": 1,
            "pg_url": pg_admin_url.rsplit("/", 1)[0] + "/" + name,
            "sides": ("today", "partitioned"),
            "defer_indexes": False,
            "keep": False,
            "out": str(tmp_path / "retention.json"),
        }
        | overrides
    )


def _exists(pg_admin_url: str, name: str) -> bool:
    async def exists() -> bool:
        conn = await asyncpg.connect(pg_admin_url)
        try:
            return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name))
        finally:
            await conn.close()

    return asyncio.run(exists())


def test_both_sides_expire_the_same_receipts(pg_admin_url: str, tmp_path: Path) -> None:
    args = _args(pg_admin_url, tmp_path)
    result = asyncio.run(run(args))

    machine = result["machine"]
    assert machine["cpus"] >= 1
    assert machine["memory_gb"] > 0
    assert machine["postgresql"].split(".")[0].isdigit()
    # Day 0 holds 500 receipts, every hundredth failed: 495 completed expire, 5 dead letters stay.
    today, partitioned = result["sweep"]["today"], result["sweep"]["partitioned"]
    assert today["deleted"] == partitioned["deleted"] == 495
    assert partitioned["moved_dead_letters"] == 5
    assert result["checks"] == {
        "expected_rows": 1505,
        "today_rows": 1505,
        "partitioned_rows": 1505,
        "keys": 1505,
        "only_in_today": 0,
        "keys_without_body": 0,
        "partitions_missing_indexes": 0,
        "ok": True,
    }
    assert not _exists(pg_admin_url, args.pg_url.rsplit("/", 1)[1])


def test_the_shipped_layout_expires_the_same_receipts(pg_admin_url: str, tmp_path: Path) -> None:
    """The product's partitioned layout, swept by partitions.expire: the oldest day's
    partition dropped, its dead letters moved, the same receipts left as today's table."""
    args = _args(pg_admin_url, tmp_path, sides=("today", "shipped"))
    result = asyncio.run(run(args))
    shipped = result["sweep"]["shipped"]
    assert result["sweep"]["today"]["deleted"] == shipped["deleted"] == 495
    assert shipped["moved_dead_letters"] == 5
    assert shipped["partitions_dropped"] == 1
    assert shipped["oldest_dropped"]
    assert result["checks"] == {
        "expected_rows": 1505,
        "today_rows": 1505,
        "shipped_rows": 1505,
        "shipped_keys": 1505,
        "shipped_keys_without_body": 0,
        "shipped_partitions_missing_indexes": 0,
        "only_in_today_not_shipped": 0,
        "ok": True,
    }
    assert not _exists(pg_admin_url, args.pg_url.rsplit("/", 1)[1])


@pytest.mark.parametrize("side", ["today", "partitioned", "shipped"])
def test_one_side_with_deferred_indexes_ends_with_every_index(
    pg_admin_url: str, tmp_path: Path, side: str
) -> None:
    """One side alone, loaded into bare heaps: it must end with the primary key and every
    index its design has (or the sweep and hot path were measured on another table)."""
    args = _args(pg_admin_url, tmp_path, sides=(side,), defer_indexes=True, keep=True)
    result = asyncio.run(run(args))
    assert result["sweep"][side]["deleted"] == 495
    # For the partitioned side: every partition with every index of the table, not the parent
    # alone (a partitioned index rebuilt "ON ONLY" the parent builds none of its partitions').
    assert result["checks"]["ok"]
    assert result["checks"]["expected_rows"] == 1505
    assert result["fill"][f"{side}_index_build_s"] > 0
    assert set(result["sweep"]) == {side}

    async def indexes() -> list[str]:
        conn = await asyncpg.connect(args.pg_url)
        try:
            return [
                row[0]
                for row in await conn.fetch(
                    "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i"
                    " JOIN pg_class c ON c.oid = i.indrelid"
                    " WHERE c.relname = ANY($1::text[]) ORDER BY 1",
                    ["receiver_receipts", "bench_keys", "bench_bodies"],
                )
            ]
        finally:
            await conn.close()
            admin = await asyncpg.connect(pg_admin_url)
            await admin.execute(f'DROP DATABASE IF EXISTS "{args.pg_url.rsplit("/", 1)[1]}"')
            await admin.close()

    built = asyncio.run(indexes())  # and drops the kept database
    if side == "shipped":
        # The tables live in their own schema: their indexes are in the checks instead.
        assert result["checks"]["shipped_partitions_missing_indexes"] == 0
        assert result["checks"]["shipped_keys_without_body"] == 0
    elif side == "today":
        # schema.sql's: the primary key and its eight secondary indexes.
        assert len(built) == 9
        assert any("receiver_receipts_pkey" in d and "(provider, webhook_id)" in d for d in built)
    else:
        # The key table's primary key and BRIN index on the day, the bodies' primary key and
        # its seven indexes.
        assert len(built) == 10
        assert any("bench_keys_pkey" in d for d in built)
        assert any("bench_keys_bucket" in d and "brin (bucket)" in d for d in built)
        assert any("bench_bodies_pkey" in d and "bucket" in d for d in built)
