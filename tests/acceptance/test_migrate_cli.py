"""``receiver migrate`` as a deploy pipeline uses it: ``--check`` fails while the database is
behind and names what is missing; two ``migrate`` processes started together apply each
migration once; ``receiver serve`` on an older schema exits, naming the missing migration."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from receiver._store.migrations import migrations
from tests import pgcluster
from tests.acceptance.test_cli import receiver
from tests.integration.test_migrations import old_schema
from tests.servers import RECEIVER, ROOT

LATEST = [m.label for m in migrations("postgresql")]


@pytest.fixture
def empty_pg(pg_admin_url: str) -> Iterator[str]:
    name = f"receiver_migcli_{os.getpid()}"
    url = asyncio.run(pgcluster.recreate_database(pg_admin_url, name))
    yield url
    asyncio.run(pgcluster.drop_database(pg_admin_url, name))


async def _execute(url: str, statements: list[str]) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
        if await conn.fetchval("SELECT to_regclass('receiver_migrations') IS NULL"):
            return []
        rows = await conn.fetch("SELECT version, name FROM receiver_migrations ORDER BY 1")
        return [(r["version"], r["name"]) for r in rows]
    finally:
        await conn.close()


def applied(url: str) -> list[tuple[int, str]]:
    return asyncio.run(_execute(url, []))


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_check_fails_while_behind_and_passes_after_migrate(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "postgresql":
        url: str = request.getfixturevalue("empty_pg")
        asyncio.run(_execute(url, old_schema("postgresql")))  # a 0.1.0 deployment
    else:
        db = sqlite3.connect(tmp_path / "r.db")
        for statement in old_schema("sqlite"):
            db.execute(statement)
        db.close()
        url = f"sqlite:///{tmp_path}/r.db"

    behind = receiver("migrate", "--check", "--store", url, cwd=tmp_path)
    assert behind.returncode == 1, behind.stderr
    assert f"missing {', '.join(LATEST[1:])}" in behind.stderr  # 0001 is the baseline
    assert "receiver migrate" in behind.stderr

    done = receiver("migrate", "--store", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [f"applied {m}" for m in LATEST[1:]] == done.stdout.splitlines()[:-1]

    current = receiver("migrate", "--check", "--store", url, cwd=tmp_path)
    assert current.returncode == 0, current.stderr
    assert current.stdout.startswith("schema up to date")


def test_check_changes_nothing_and_a_url_naming_no_file_migrates_nothing(tmp_path: Path) -> None:
    missing = receiver("migrate", "--check", "--store", "sqlite:///absent.db", cwd=tmp_path)
    assert missing.returncode == 2, missing.stderr
    assert "no SQLite database at absent.db" in missing.stderr
    nowhere = receiver("migrate", "--store", "sqlite://", cwd=tmp_path)
    assert nowhere.returncode == 2, nowhere.stderr
    assert "names no file" in nowhere.stderr
    assert list(tmp_path.iterdir()) == []


def test_two_migrate_processes_at_once_apply_each_migration_once(empty_pg: str) -> None:
    runs = [
        subprocess.Popen(
            [RECEIVER, "migrate", "--store", empty_pg],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    reported = sorted(
        line.removeprefix("applied ")
        for out, _ in outputs
        for line in out.splitlines()
        if line.startswith("applied ")
    )
    assert reported == LATEST
    assert [v for v, _ in applied(empty_pg)] == list(range(1, len(LATEST) + 1))


def test_serve_refuses_an_old_schema_naming_the_missing_migration(empty_pg: str) -> None:
    asyncio.run(_execute(empty_pg, old_schema("postgresql")))
    env = {**os.environ, "RECEIVER_STORE": empty_pg, "RECEIVER_SECRET": "whsec_" + "A" * 32}
    served = subprocess.run(
        [RECEIVER, "serve", "--app", "tests.apps.server:app", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode != 0
    assert "0002_response_headers" in served.stdout + served.stderr
    assert "receiver migrate" in served.stdout + served.stderr
