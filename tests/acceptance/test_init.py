"""``receiver init``: the project it writes passes its own three tests right away, on the
embedded SQLite default and on PostgreSQL (a throwaway database of the test server), for a
webhook receiver (inline and queued) and for an agent's tool; and those tests fail when the
handler writes outside the ledger's transaction, so they prove something."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.pgcluster import free_port
from tests.servers import RECEIVER

pytestmark = pytest.mark.slow

OUTSIDE_TX = """\
        async with rx.store.acquire() as own:  # outside the ledger's transaction: a bug
            await own.execute(
                "INSERT INTO orders (id, total) VALUES ($1, $2)",
                order["order_id"],
                order["amount_cents"],
            )
"""
INSIDE_TX = """\
        await tx.execute(
            "INSERT INTO orders (id, total) VALUES ($1, $2)",
            order["order_id"],
            order["amount_cents"],
        )
"""


def init(directory: Path, *options: str) -> None:
    made = subprocess.run(
        [RECEIVER, "init", str(directory), *options], capture_output=True, text=True, check=False
    )
    assert made.returncode == 0, made.stderr
    assert "python -m pytest" in made.stdout


def pytest_in(directory: Path, pg_url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "RECEIVER_"))}
    if pg_url is not None:
        env["RECEIVER_TEST_PG_URL"] = pg_url
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("kind", "option"),
    [("sqlite", ""), ("postgresql", ""), ("sqlite", "--tool"), ("sqlite", "--queued")],
)
def test_the_project_passes_its_three_tests(
    tmp_path: Path, kind: str, option: str, pg_admin_url: str
) -> None:
    project = tmp_path / "shop"
    init(project, *filter(None, [option]))
    ran = pytest_in(project, pg_admin_url if kind == "postgresql" else None)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 passed" in ran.stdout, ran.stdout


def test_its_tests_catch_a_handler_writing_outside_tx(tmp_path: Path) -> None:
    project = tmp_path / "shop"
    init(project)
    handlers = project / "orders.py"
    text = handlers.read_text()
    assert INSIDE_TX in text
    handlers.write_text(text.replace(INSIDE_TX, OUTSIDE_TX))
    ran = pytest_in(project, None)
    assert ran.returncode == 1, ran.stdout
    assert "test_a_crash_mid_handler_runs_once_after_recovery FAILED" in ran.stdout or (
        "FAILED test_orders.py::test_a_crash_mid_handler_runs_once_after_recovery" in ran.stdout
    ), ran.stdout


BAD_ORDERS = """\
import pytest

from receiver.testing import Sender, assert_count
from test_orders import SECRET, build


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {},
        {"order_id": "o", "amount_cents": 2**31},
        {"order_id": "o", "amount_cents": 1.5},
        {"order_id": "a\\x00b", "amount_cents": 1},
    ],
)
async def test_an_order_the_table_cannot_hold_is_a_final_422(receiver_store, receiver_clock, data):
    rx = await build(receiver_store, receiver_clock)
    async with rx, Sender(rx, "shop", SECRET, clock=receiver_clock) as shop:
        answer = await shop.send(shop.event("order.created", data))
        assert answer.status == 422, answer
        await assert_count(rx.store, 0, "SELECT count(*) FROM orders")
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_its_handler_answers_422_to_an_order_the_table_cannot_hold(
    tmp_path: Path, kind: str, pg_admin_url: str
) -> None:
    # A 5xx would have the sender retry an event that can never fit, for days.
    project = tmp_path / "shop"
    init(project)
    (project / "test_bad_orders.py").write_text(BAD_ORDERS)
    ran = pytest_in(project, pg_admin_url if kind == "postgresql" else None)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "9 passed" in ran.stdout, ran.stdout


def test_a_tool_is_never_queued(tmp_path: Path) -> None:
    made = subprocess.run(
        [RECEIVER, "init", str(tmp_path / "x"), "--tool", "--queued"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 2
    assert "--queued is for webhooks" in made.stderr
    assert not (tmp_path / "x").exists()


def test_it_never_overwrites_a_project(tmp_path: Path) -> None:
    init(tmp_path)
    again = subprocess.run([RECEIVER, "init", str(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 2
    assert "already exist" in again.stderr
    assert "--force" in again.stderr


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("link", ["dangling", "file outside", "directory outside"])
def test_it_never_writes_through_a_link(tmp_path: Path, link: str, force: bool) -> None:
    project, outside = tmp_path / "shop", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "kept.txt").write_text("theirs")
    (project / "notes.txt").write_text("mine")
    target = {
        "dangling": outside / "created.py",
        "file outside": outside / "kept.txt",
        "directory outside": outside,
    }[link]
    (project / "orders.py").symlink_to(target)
    made = subprocess.run(
        [RECEIVER, "init", str(project), *(["--force"] if force else [])],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 2, made.stdout + made.stderr
    assert made.stderr.splitlines() == [
        f"receiver: symbolic links in {project}: orders.py; init never writes through a link: "
        "remove them, or choose another directory"
    ]
    # Refused before anything was written, inside the directory or outside it.
    assert sorted(p.name for p in outside.iterdir()) == ["kept.txt"]
    assert (outside / "kept.txt").read_text() == "theirs"
    assert sorted(p.name for p in project.iterdir()) == ["notes.txt", "orders.py"]
    assert (project / "orders.py").readlink() == target


def test_receiver_send_with_its_default_data_creates_an_order(tmp_path: Path) -> None:
    # One data shape: `receiver send`'s default event is an order the project's handler takes.
    project = tmp_path / "shop"
    init(project)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env["SHOP_WEBHOOK_SECRET"] = secret = "whsec_" + "c2hvcC1zZWNyZXQta2V5LTMyLWJ5dGVzISE="
    # As the project's README says: its own tables first, then serve.
    subprocess.run(
        [RECEIVER, "migrate", "--config", "receiver.toml"], cwd=project, env=env, check=True
    )
    server = subprocess.Popen(
        [RECEIVER, "serve", "--config", "receiver.toml", "--port", str(port)],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                assert server.poll() is None
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/shop"
        send = [RECEIVER, "send", "--url", url, "--secret", secret, "--id", "msg_1"]
        first, again = (
            subprocess.run(send, capture_output=True, text=True, check=False, env=env)
            for _ in range(2)
        )
        assert first.returncode == 0, first.stdout + first.stderr
        assert first.stdout.splitlines()[-1] == '{"order_id":"o-1","status":"created"}'
        assert "idempotent-replayed: true" in again.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)
