"""The agents example as real processes: the scripted demo runs with no network and no model,
and two planner processes consuming the same action queue execute every action once and end
with the same results (the ledger absorbs the second planner)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from examples.agents.tools import create_tables
from receiver import store_from_url
from tests.support import query

pytestmark = pytest.mark.slow

ORDERS = 30


def planner(url: str, *, reverse: bool) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "examples.agents", "--store", url, "--queue"]
    command += ["--orders", str(ORDERS)] + (["--reverse"] if reverse else [])
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def reset(url: str) -> None:
    """Empty business tables, created before the planners start (two processes creating one
    PostgreSQL table at once can collide in its catalog)."""
    for table in ("refunds", "outbox", "tickets"):
        await query(url, f"DROP TABLE IF EXISTS example_{table}")
    async with store_from_url(url) as store:
        await create_tables(store)


def test_the_scripted_demo_runs_offline() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.agents"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "every action took effect once" in done.stdout
    assert '"refunds": 2, "outbox": 1, "tickets": 1' in done.stdout


def test_two_planner_processes_on_one_queue_execute_each_action_once(
    store_url: str, tmp_path: Path
) -> None:
    asyncio.run(reset(store_url))
    first, second = planner(store_url, reverse=False), planner(store_url, reverse=True)
    outputs = [p.communicate(timeout=180) for p in (first, second)]
    for proc, (_, err) in zip((first, second), outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    results = [orjson.loads(out) for out, _ in outputs]
    assert results[0] == results[1]
    refunds = asyncio.run(query(store_url, "SELECT action_key FROM example_refunds"))
    assert len(refunds) == ORDERS + 2  # every queued refund and the conversation's two
    assert len({r[0] for r in refunds}) == len(refunds)
    outbox = asyncio.run(query(store_url, "SELECT count(*) FROM example_outbox"))
    tickets = asyncio.run(query(store_url, "SELECT count(*) FROM example_tickets"))
    assert (outbox[0][0], tickets[0][0]) == (1, 1)
    states = asyncio.run(
        query(
            store_url,
            "SELECT state, count(*) FROM receiver_receipts "
            "WHERE provider LIKE 'action:%' GROUP BY state",
        )
    )
    assert dict(states) == {"completed": ORDERS + 4}
