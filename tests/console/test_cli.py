"""``receiver console`` as a real process: it refuses to start without a token, and serves
the console behind it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests import pgcluster
from tests.conftest import TEST_DATABASE

from .conftest import free_port
from .shop import TOKEN

RECEIVER = [str(Path(sys.executable).parent / "receiver")]


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RECEIVER, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_it_needs_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    missing = run("console", "--store", store, env=env)
    assert missing.returncode == 2
    assert "RECEIVER_CONSOLE_TOKEN" in missing.stderr
    short = run("console", "--store", store, env={**env, "RECEIVER_CONSOLE_TOKEN": "short"})
    assert short.returncode == 2
    assert "at least 16 characters" in short.stderr
    no_file = run("console", "--store", store, "--token-file", str(tmp_path / "none"), env=env)
    assert no_file.returncode == 2
    assert "cannot read --token-file" in no_file.stderr
    assert not (tmp_path / "ledger.db").exists()


def test_it_serves_the_console_behind_the_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert run("migrate", "--store", store, env=env).returncode == 0
    process = subprocess.Popen(
        [
            *RECEIVER,
            "console",
            "--store",
            store,
            "--token-file",
            str(token_file),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                refused = httpx.get(url + "/")
                break
            except httpx.ConnectError:
                assert process.poll() is None, process.stdout.read() if process.stdout else ""
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert refused.status_code == 401
        with httpx.Client(base_url=url) as client:
            login = client.get("/login")
            assert login.status_code == 200
            signed = client.post(
                "/login",
                data={
                    "csrf": client.cookies["receiver_console_csrf"],
                    "name": "Ada",
                    "token": TOKEN,
                    "next": "/",
                },
            )
            assert signed.status_code == 303
            overview = client.get("/")
            assert overview.status_code == 200
            assert "signed in as Ada" in overview.text
            assert "no handlers: replays are off" in overview.text
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_files_it_cannot_use_are_one_line_errors(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    (tmp_path / "token").write_bytes(b"\xff" + TOKEN.encode())
    (tmp_path / "latin1.toml").write_bytes(b'[[operator]]\nname = "Jos\xe9"\n')
    (tmp_path / "array.toml").write_text("operator = [1, 2]\n")
    for args, says in (
        (["--token-file", str(tmp_path / "token")], "is not UTF-8 text"),
        (["--console-operators", str(tmp_path / "latin1.toml")], "is not UTF-8 text"),
        (["--console-operators", str(tmp_path / "array.toml")], "[[operator]] tables only"),
    ):
        done = run("console", "--store", store, *args, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert TOKEN not in done.stderr
    # A path with a typo is reported, not served as a new, empty ledger.
    typo = run("console", "--store", store, env={**env, "RECEIVER_CONSOLE_TOKEN": TOKEN})
    assert typo.returncode == 2
    assert "no SQLite database at" in typo.stderr
    assert not (tmp_path / "ledger.db").exists()


async def test_a_ledger_it_cannot_serve_is_a_one_line_start_up_failure(
    tmp_path: Path, pg_admin_url: str
) -> None:
    """Not migrated, or not reachable: the console exits saying so in one line (it was a
    traceback from the lifespan)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env["RECEIVER_CONSOLE_TOKEN"] = TOKEN
    url = await pgcluster.recreate_database(pg_admin_url, f"{TEST_DATABASE}_console_bare")
    try:
        for store, says in (
            (url, "console: the console needs the ledger's migration(s) 0001_initial"),
            ("postgresql://postgres@127.0.0.1:1/nowhere", "console: PostgreSQL unavailable"),
        ):
            done = run("console", "--store", store, "--port", "0", env=env)
            assert done.returncode == 3, done.stderr
            assert says in done.stderr, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
            assert TOKEN not in done.stderr
    finally:
        await pgcluster.drop_database(pg_admin_url, f"{TEST_DATABASE}_console_bare")
