"""Queued ingest while PostgreSQL restarts: 503 while it is down, nothing acknowledged (202) is
lost, and every acknowledged delivery is processed exactly once after it returns, by a worker
process that lived through the outage."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests import pgcluster
from tests.acceptance.test_outage import cluster, database, throwaway  # noqa: F401 (fixtures)
from tests.acceptance.test_queued_workers import (
    QUEUED,
    effects_by_id,
    env_for,
    executions,
    post,
    states,
    stop,
    wait_completed,
)
from tests.servers import running, start_worker
from tests.support import body_of

pytestmark = pytest.mark.slow

BEFORE = 5
DURING = 8


async def test_queued_ingest_through_a_database_restart(
    cluster: pgcluster.Cluster,  # noqa: F811
    database: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    invocations = tmp_path / "invocations"
    # A short lease: attempts cut by the outage are taken over soon after it.
    env = env_for(database, invocations, RECEIVER_TEST_LEASE="3")
    before = [f"before_{i}" for i in range(BEFORE)]
    during = [f"during_{i}" for i in range(DURING)]
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

                async def send(webhook_id: str) -> httpx.Response:
                    return await post(client, webhook_id, body_of(order=webhook_id))

                for answer in await asyncio.gather(*(send(i) for i in before)):
                    assert (answer.status_code, answer.content) == (202, QUEUED)

                cluster.stop()
                for answer in await asyncio.gather(*(send(i) for i in during)):
                    assert answer.status_code == 503, answer.content
                    assert int(answer.headers["retry-after"]) >= 1

                cluster.start()
                deadline = time.monotonic() + 20
                answer = await send(during[0])
                while answer.status_code == 503 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    answer = await send(during[0])
                assert (answer.status_code, answer.content) == (202, QUEUED), server.output()
                for answer in await asyncio.gather(*(send(i) for i in during[1:])):
                    assert (answer.status_code, answer.content) == (202, QUEUED)

            everything = before + during
            await wait_completed(
                database, len(everything), 60, (tmp_path / "worker.log").read_text()
            )
            assert worker.poll() is None, "the worker must live through the outage"
    finally:
        stop(worker)
    # An attempt the outage cut short (its statement failed mid-handler) rolled back and ran
    # again: every delivery ran at least once, and exactly one attempt of each committed.
    assert set(executions(invocations)) == set(everything)
    committed = await effects_by_id(database)
    assert {i: len(fences) for i, fences in committed.items()} == dict.fromkeys(everything, 1)
    assert await states(database) == {"completed": len(everything)}


async def test_a_worker_started_while_the_database_is_down_waits_for_it(
    cluster: pgcluster.Cluster,  # noqa: F811
    database: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A worker (re)started during an outage, as an orchestrator does, waits for the database
    instead of exiting, then runs what was queued."""
    invocations = tmp_path / "invocations"
    env = env_for(database, invocations)
    queued = [f"queued_{i}" for i in range(BEFORE)]
    with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for webhook_id in queued:
                answer = await post(client, webhook_id, body_of(order=webhook_id))
                assert (answer.status_code, answer.content) == (202, QUEUED)
    cluster.stop()
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    try:
        deadline = time.monotonic() + 30
        while "store unavailable at start" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert worker.poll() is None, f"the worker exited during the outage: {log.read_text()}"
        cluster.start()
        await wait_completed(database, len(queued), 30, log.read_text())
    finally:
        stop(worker)
    assert sorted(executions(invocations)) == sorted(queued)
    effects = await effects_by_id(database)
    assert sorted(effects) == sorted(queued)
    assert all(len(fences) == 1 for fences in effects.values())
