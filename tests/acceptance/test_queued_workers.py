"""Queued mode with real processes on PostgreSQL: ``receiver serve`` answers 202, separate
``receiver worker`` processes run the handlers.

- a worker SIGKILLed mid-handler: another worker runs the receipt once more under the next
  fence, and exactly one effect commits; killed in the middle of a group transaction, none of
  the group's members commits, and each runs once more;
- three workers, 1,000 deliveries with random duplicates: every sender answer is a 202 or its
  replay, and each delivery is executed exactly once;
- SIGTERM while handlers run: the worker finishes them before it exits; nothing is lost and
  nothing runs twice.
"""

from __future__ import annotations

import asyncio
import collections
import random
import signal
import subprocess
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import truncate
from tests.servers import running, start_worker
from tests.support import PROVIDER, SECRET, body_of, signed

pytestmark = pytest.mark.slow

QUEUED = b'{"status":"queued"}'
LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=32, keepalive_expiry=1.0)


def executions(path: Path) -> collections.Counter[str]:
    if not path.exists():
        return collections.Counter()
    return collections.Counter(line.split()[0] for line in path.read_text().splitlines())


async def states(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        rows = await conn.fetch("SELECT state, count(*) AS n FROM receiver_receipts GROUP BY 1")
    finally:
        await conn.close()
    return {r["state"]: r["n"] for r in rows}


async def effects_by_id(url: str) -> dict[str, list[int]]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        rows = await conn.fetch("SELECT webhook_id, fence FROM effects ORDER BY fence")
    finally:
        await conn.close()
    found: dict[str, list[int]] = collections.defaultdict(list)
    for r in rows:
        found[r["webhook_id"]].append(r["fence"])
    return dict(found)


async def wait_completed(url: str, n: int, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while (got := await states(url)).get("completed", 0) < n:
        assert time.monotonic() < deadline, f"{what}: only {got} after {within} s"
        await asyncio.sleep(0.2)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def post(client: httpx.AsyncClient, webhook_id: str, body: bytes) -> httpx.Response:
    return await client.post(f"/{PROVIDER}", content=body, headers=signed(webhook_id, body))


def env_for(url: str, invocations: Path, **extra: str) -> dict[str, str]:
    return {
        "RECEIVER_STORE": url,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        **extra,
    }


async def test_a_killed_worker_s_receipt_runs_once_more_under_the_next_fence(
    pg_url: str, tmp_path: Path
) -> None:
    await truncate(pg_url)
    invocations = tmp_path / "invocations"
    env = env_for(pg_url, invocations, RECEIVER_TEST_CRASH_IDS="doomed", RECEIVER_TEST_LEASE="2")
    with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await post(client, "doomed", body_of(order=1))
            assert (answer.status_code, answer.content) == (202, QUEUED)
        first = start_worker(env, tmp_path / "worker.log")
        try:
            assert first.wait(timeout=30) == -signal.SIGKILL  # died mid-handler
        finally:
            stop(first)
        assert await states(pg_url) == {"in_flight": 1}
        second = start_worker(env, tmp_path / "worker.log")
        try:
            # Taken over once the dead worker's 2 s lease has run out.
            await wait_completed(pg_url, 1, 30, (tmp_path / "worker.log").read_text())
        finally:
            stop(second)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            again = await post(client, "doomed", body_of(order=1))
            assert (again.status_code, again.content) == (202, QUEUED)
            assert again.headers["idempotent-replayed"] == "true"
    lines = invocations.read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [["doomed", "1"], ["doomed", "2"]]
    assert lines[0].split()[2] == str(first.pid)
    assert lines[1].split()[2] == str(second.pid)
    assert await effects_by_id(pg_url) == {"doomed": [2]}


async def test_a_worker_killed_mid_group_commits_none_of_it_and_each_runs_once_more(
    pg_url: str, tmp_path: Path
) -> None:
    await truncate(pg_url)
    invocations = tmp_path / "invocations"
    env = env_for(pg_url, invocations, RECEIVER_TEST_CRASH_IDS="msg_3", RECEIVER_TEST_LEASE="2")
    ids = [f"msg_{i}" for i in range(8)]
    with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for webhook_id in ids:
                assert (
                    await post(client, webhook_id, body_of(order=webhook_id))
                ).status_code == 202
    first = start_worker(env, tmp_path / "worker.log")
    try:
        assert first.wait(timeout=30) == -signal.SIGKILL  # died in msg_3's handler
    finally:
        stop(first)
    # msg_0 to msg_2 ran to the end in the same transaction: nothing of it committed.
    assert await effects_by_id(pg_url) == {}
    assert await states(pg_url) == {"in_flight": 8}
    second = start_worker(env, tmp_path / "worker.log")
    try:
        await wait_completed(pg_url, 8, 30, (tmp_path / "worker.log").read_text())
    finally:
        stop(second)
    runs = [line.split() for line in invocations.read_text().splitlines()]
    assert [r[0] for r in runs if r[2] == str(first.pid)] == ["msg_0", "msg_1", "msg_2", "msg_3"]
    assert sorted(r[0] for r in runs if r[2] == str(second.pid)) == ids
    assert await effects_by_id(pg_url) == {i: [2] for i in ids}


UNIQUE = 1000
DUPLICATES = 300


async def test_three_workers_run_each_of_1000_deliveries_exactly_once(
    pg_url: str, tmp_path: Path
) -> None:
    await truncate(pg_url)
    invocations = tmp_path / "invocations"
    env = env_for(pg_url, invocations)
    rng = random.Random(11)
    ids = [f"msg_{i}" for i in range(UNIQUE)]
    sends = ids + [rng.choice(ids) for _ in range(DUPLICATES)]
    rng.shuffle(sends)
    workers = [start_worker(env, tmp_path / f"worker{n}.log") for n in range(3)]
    try:
        with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=LIMITS) as client:
                gate = asyncio.Semaphore(32)

                async def send(webhook_id: str) -> httpx.Response:
                    async with gate:
                        return await post(client, webhook_id, body_of(order=webhook_id))

                answers = await asyncio.gather(*(send(i) for i in sends))
            fresh = collections.Counter[str]()
            for webhook_id, answer in zip(sends, answers, strict=True):
                assert (answer.status_code, answer.content) == (202, QUEUED), answer.content
                if answer.headers.get("idempotent-replayed") != "true":
                    fresh[webhook_id] += 1
            assert fresh == collections.Counter(ids)  # one fresh 202 per id, the rest replays
            await wait_completed(pg_url, UNIQUE, 120, "the workers did not drain the queue")
    finally:
        for worker in workers:
            stop(worker)
    assert executions(invocations) == collections.Counter(ids)
    assert await effects_by_id(pg_url) == {i: [1] for i in ids}
    pids = {line.split()[2] for line in invocations.read_text().splitlines()}
    assert len(pids) == 3, f"every worker should have taken a share: {pids}"
    assert await states(pg_url) == {"completed": UNIQUE}


async def test_sigterm_lets_running_handlers_finish(pg_url: str, tmp_path: Path) -> None:
    await truncate(pg_url)
    invocations = tmp_path / "invocations"
    env = env_for(pg_url, invocations, RECEIVER_TEST_SLOW="1.5")
    ids = [f"slow_{i}" for i in range(12)]
    with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for webhook_id in ids:
                assert (await post(client, webhook_id, body_of(order=1))).status_code == 202
        worker = start_worker(env, tmp_path / "worker.log", concurrency=4, grace=20)
        try:
            deadline = time.monotonic() + 30
            while sum(executions(invocations).values()) < 4:
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
                await asyncio.sleep(0.05)
            worker.send_signal(signal.SIGTERM)  # four handlers are sleeping in their transactions
            assert worker.wait(timeout=30) == 0
        finally:
            stop(worker)
        started = executions(invocations)
        assert sum(started.values()) >= 4
        assert (await states(pg_url)).get("completed", 0) == len(started)  # finished, not cut
        rest = start_worker(env, tmp_path / "worker.log", concurrency=8)
        try:
            await wait_completed(pg_url, len(ids), 60, "the second worker did not finish")
        finally:
            stop(rest)
    assert executions(invocations) == collections.Counter(ids)  # nothing ran twice
    assert await effects_by_id(pg_url) == {i: [1] for i in ids}
