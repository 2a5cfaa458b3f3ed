"""Fixtures of the durable-execution integrations: a database of their own (DBOS keeps its
system tables there, beside the ledger) and the side-by-side experiment's fake payment service."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from benchmarks.durable.experiment import Experiment
from benchmarks.durable.prefect_server import prefect_server
from receiver import PostgresStore
from tests import pgcluster

DURABLE_DATABASE = f"receiver_test_durable_{os.getpid()}"


async def _migrated(admin_url: str) -> str:
    url = await pgcluster.recreate_database(admin_url, DURABLE_DATABASE)
    async with PostgresStore(url) as store:
        await store.migrate()
    return url


@pytest.fixture(scope="session")
def durable_db(pg_admin_url: str) -> Iterator[str]:
    """A migrated database shared by the DBOS workers of the whole session."""
    yield asyncio.run(_migrated(pg_admin_url))
    asyncio.run(pgcluster.drop_database(pg_admin_url, DURABLE_DATABASE))


@pytest.fixture
async def experiment(tmp_path: Path) -> AsyncIterator[Experiment]:
    """The fake payment service, a process of its own, counting refunds per order."""
    async with Experiment(tmp_path) as running:
        yield running


@pytest.fixture(scope="session")
def prefect_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One Prefect API server (loopback, SQLite in a temporary directory) for the session: the
    environment its worker processes run with."""
    with prefect_server(tmp_path_factory.mktemp("prefect")) as env:
        yield env
