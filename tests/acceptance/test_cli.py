"""The real ``receiver`` command, as a person would use it: serve the demo app on SQLite, send a
delivery, send it again and see the replay; migrate twice; ttl, inspect, sweep."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.pgcluster import free_port
from tests.servers import RECEIVER, ROOT


def receiver(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RECEIVER, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_serve_send_and_replay_on_the_embedded_default(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env["PYTHONPATH"] = str(ROOT)  # the demo app's package, as in a clone
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(
        [RECEIVER, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/demo"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, Path(log.name).read_text()
                assert server.poll() is None, Path(log.name).read_text()
                time.sleep(0.1)
        banner = Path(log.name).read_text()
        secret = re.search(r"export RECEIVER_SECRET=(whsec_\S+)", banner)
        assert secret, banner
        assert f"receiver send --url {url} --secret {secret.group(1)} --id msg_demo_1" in banner

        send = ["send", "--url", url, "--secret", secret.group(1), "--id", "msg_demo_1"]
        first = receiver(*send, cwd=tmp_path, env=env)
        second = receiver(*send, cwd=tmp_path, env=env)
        assert first.returncode == 0, first.stderr
        assert "HTTP 200" in first.stdout
        assert "idempotent-replayed" not in first.stdout
        assert "idempotent-replayed: true" in second.stdout
        assert first.stdout.splitlines()[-1] == second.stdout.splitlines()[-1]  # same body

        other = receiver(*send, "--data", '{"order_id": "o-2"}', cwd=tmp_path, env=env)
        assert "HTTP 422" in other.stdout
        forged = receiver(
            *send[:-4], "--secret", "whsec_" + "A" * 32, "--id", "x", cwd=tmp_path, env=env
        )
        assert "HTTP 401" in forged.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)

    assert (tmp_path / "receiver.db").exists()  # the embedded default, in the working directory
    shown = receiver("inspect", "demo", "msg_demo_1", cwd=tmp_path, env=env)
    assert "state        completed (fence 1)" in shown.stdout
    assert '"status":"created"' in shown.stdout


def test_migrate_is_idempotent(pg_admin_url: str) -> None:
    import asyncio

    from tests import pgcluster

    url = asyncio.run(pgcluster.recreate_database(pg_admin_url, f"receiver_cli_{os.getpid()}"))
    try:
        for _ in range(2):
            done = receiver("migrate", "--store", url, cwd=ROOT)
            assert done.returncode == 0, done.stderr
            assert "schema ready" in done.stdout
            assert (
                "@" not in done.stdout.split("://", 1)[1].split("/")[0]
                or "postgres@" in done.stdout
            )
    finally:
        asyncio.run(pgcluster.drop_database(pg_admin_url, f"receiver_cli_{os.getpid()}"))


def test_ttl_explains_each_window(tmp_path: Path) -> None:
    shown = receiver(
        "ttl",
        "--app",
        "handlers:app",
        cwd=ROOT,
        env={
            "RECEIVER_SECRET": "whsec_" + "A" * 32,
            "RECEIVER_STORE": f"sqlite:///{tmp_path}/r.db",
        },
    )
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()
    assert header.split() == ["provider", "schedule", "span", "margin", "window", "source"]
    assert row.split()[:6] == ["demo", "svix", "(8", "attempts)", "27h", "35m"]
    assert "52h" in row


def test_unknown_store_scheme_is_a_clear_error(tmp_path: Path) -> None:
    done = receiver("migrate", "--store", "mysql://x/y", cwd=tmp_path)
    assert done.returncode == 2
    assert "unsupported store URL" in done.stderr
