"""The completions benchmark on a few batches: every shape must complete every receipt of each
batch (its figures are per completion; run() raises when one does not)."""

from __future__ import annotations

import asyncio
import os

from benchmarks.completions import SHAPES, run
from tests import pgcluster


def test_every_shape_completes_each_batch(pg_admin_url: str) -> None:
    name = f"receiver_completions_test_{os.getpid()}"
    url = asyncio.run(pgcluster.recreate_database(pg_admin_url, name))
    try:
        result = asyncio.run(run(url, rows=500, sizes=[1, 5], rounds=1, batches=3))
    finally:
        asyncio.run(pgcluster.drop_database(pg_admin_url, name))
    assert set(result) == {"1", "5"}
    for shapes in result.values():
        assert set(shapes) == set(SHAPES)
        for figures in shapes.values():
            assert figures["server_us"] >= 0
            assert figures["client_us"] > 0
