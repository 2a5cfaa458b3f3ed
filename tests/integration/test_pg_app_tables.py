"""The tables of a ``receiver init`` project are created by ``receiver migrate`` as the
database's owner (its ``sql/`` files), and the project then serves as the least-privilege role
docs/how-to/postgresql.md "Privileges" lists, on a real PostgreSQL. A startup hook that such a
role may not run (the DDL of an older project) fails the start-up of ``receiver serve`` with one
line naming the GRANT, never a traceback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from receiver import generate_secret
from tests import pgcluster
from tests.servers import RECEIVER

pytestmark = pytest.mark.slow

# docs/how-to/postgresql.md "Privileges", and the app's own table.
GRANTS = """
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT CONNECT ON DATABASE {db} TO {role};
GRANT USAGE ON SCHEMA public TO {role};
GRANT SELECT ON receiver_migrations TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON receiver_receipts, receiver_attempts TO {role};
"""
SECRET = generate_secret()
STARTUP_DDL = """\
    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT, total INTEGER)")

"""


def cli(project: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    return subprocess.run(
        [RECEIVER, *args],
        cwd=project,
        env={**env, "SHOP_WEBHOOK_SECRET": SECRET},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
async def least_privilege(pg_admin_url: str) -> AsyncIterator[tuple[str, str]]:
    """A migrated ledger's database: (the owner's URL, the least-privilege role's URL)."""
    db = f"receiver_test_app_tables_{os.getpid()}"
    role = f"receiver_app_tables_{os.getpid()}"
    owner_url = await pgcluster.recreate_database(pg_admin_url, db)
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        yield owner_url, owner_url.replace("postgres@", f"{role}@", 1)
    finally:
        await pgcluster.drop_database(pg_admin_url, db)
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def grant(owner_url: str, *extra: str) -> None:
    db = owner_url.rsplit("/", 1)[1]
    role = f"receiver_app_tables_{os.getpid()}"
    conn = await asyncpg.connect(owner_url)
    try:
        for statement in [*GRANTS.format(db=db, role=role).strip().splitlines(), *extra]:
            await conn.execute(statement.format(role=role))
    finally:
        await conn.close()


def init(tmp_path: Path) -> Path:
    project = tmp_path / "shop"
    made = subprocess.run([RECEIVER, "init", str(project)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return project


def serve_and_send(project: Path, app_url: str, log_path: Path) -> None:
    """Serve the project as the role of ``app_url``; send one order twice: run, then replay."""
    port = pgcluster.free_port()
    log = log_path.open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    serve = [RECEIVER, "serve", "--config", "receiver.toml", "--store", app_url]
    server = subprocess.Popen(
        [*serve, "--port", str(port)],
        cwd=project,
        env={**env, "SHOP_WEBHOOK_SECRET": SECRET},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        send = ["send", "--url", f"{url}/shop", "--secret", SECRET, "--type", "order.created"]
        data = ["--data", '{"order_id": "ord_1", "amount_cents": 1200}', "--id", "msg_1"]
        first, second = cli(project, *send, *data), cli(project, *send, *data)
        assert first.returncode == 0, first.stdout + first.stderr
        assert second.returncode == 0, second.stdout + second.stderr
        assert "idempotent-replayed: true" in second.stdout, second.stdout
    finally:
        server.terminate()
        server.wait(timeout=20)


async def test_an_init_project_serves_as_the_least_privilege_role(
    tmp_path: Path, least_privilege: tuple[str, str]
) -> None:
    owner_url, app_url = least_privilege
    project = init(tmp_path)
    migrated = cli(project, "migrate", "--config", "receiver.toml", "--store", owner_url)
    assert migrated.returncode == 0, migrated.stderr
    assert "applied 0001_orders.sql (the app's)" in migrated.stdout, migrated.stdout
    again = cli(project, "migrate", "--config", "receiver.toml", "--store", owner_url)
    assert again.returncode == 0, again.stderr
    assert "applied" not in again.stdout, again.stdout  # each file once
    await grant(owner_url, "GRANT SELECT, INSERT ON orders TO {role}")

    await asyncio.to_thread(serve_and_send, project, app_url, tmp_path / "serve.log")
    conn = await asyncpg.connect(app_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM orders WHERE id = 'ord_1'") == 1
    finally:
        await conn.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


async def test_a_startup_hook_refused_for_privileges_is_one_line(
    tmp_path: Path, least_privilege: tuple[str, str]
) -> None:
    owner_url, app_url = least_privilege
    project = init(tmp_path)
    handlers = project / "orders.py"
    text = handlers.read_text()
    marker = '    @rx.on("order.created")'
    handlers.write_text(text.replace(marker, STARTUP_DDL + marker, 1))
    migrated = cli(project, "migrate", "--store", owner_url)  # the ledger only: no orders table
    assert migrated.returncode == 0, migrated.stderr
    await grant(owner_url)
    port = str(pgcluster.free_port())
    serve = ["serve", "--config", "receiver.toml", "--store", app_url, "--port", port]
    done = cli(project, *serve, "--log-format", "text")
    assert done.returncode == 3, done.stdout + done.stderr  # uvicorn's start-up failure
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    alerts = [line for line in output.splitlines() if "ALERT" in line]
    assert len(alerts) == 1, output
    assert "orders.tables was refused for privileges (SQLSTATE 42501)" in alerts[0], output
    assert "GRANT CREATE ON SCHEMA public TO the store URL's role" in alerts[0], output
    assert "receiver migrate --config receiver.toml" in alerts[0], output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert errors == [alerts[0], errors[-1]], output  # and uvicorn's own last word:
    assert errors[-1].endswith("Application startup failed. Exiting."), output
