"""Fixtures of the acceptance tests: real server processes on a shared store."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import truncate


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store the server processes share: the test database (emptied), or a SQLite file."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        asyncio.run(truncate(url))
        return url
    return f"sqlite:///{tmp_path}/r.db"


@pytest.fixture
def served() -> Iterator[list[subprocess.Popen[str]]]:
    """The servers a test started as a user would (a shell command), stopped after it."""
    servers: list[subprocess.Popen[str]] = []
    yield servers
    for server in servers:
        server.terminate()
        server.wait(timeout=10)
