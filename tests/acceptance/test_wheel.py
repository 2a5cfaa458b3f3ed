"""The package as a user gets it: build the sdist and the wheel (the wheel from the sdist, as
``python -m build`` does), check that the SQL files, the migrations and ``py.typed`` are inside,
install the wheel (not editable) into a fresh virtualenv, then run ``receiver migrate`` and one
signed delivery against ``receiver serve`` from it, away from the source tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.pgcluster import free_port
from tests.servers import ROOT

pytestmark = pytest.mark.slow

PACKAGED = sorted(
    str(p.relative_to(ROOT))
    for p in [
        ROOT / "receiver" / "py.typed",
        *(ROOT / "receiver" / "_store" / "sql").rglob("*.sql"),
    ]
)


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_wheel_installs_clean_and_serves(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RECEIVER_", "PYTHON", "VIRTUAL_ENV"))
    }
    # A copy of the source, so that the build leaves nothing in the working tree.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.db*", "benchmarks"
        ),
    )
    dist = tmp_path / "dist"
    output = run(sys.executable, "-m", "build", "--outdir", dist, source, cwd=tmp_path, env=env)
    assert "absent from the `packages` configuration" not in output
    (sdist,) = dist.glob("receiver_webhooks-*.tar.gz")
    (wheel,) = dist.glob("receiver_webhooks-*.whl")
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    assert "receiver/_store/sql/migrations/postgresql/0001_initial.sql" in PACKAGED
    assert [p for p in PACKAGED if p not in in_sdist] == []
    assert [p for p in PACKAGED if p not in in_wheel] == []
    assert not any(name.startswith("tests/") for name in in_wheel)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    run(venv / "bin" / "python", "-m", "pip", "install", wheel, cwd=tmp_path, env=env, timeout=600)
    home = tmp_path / "home"  # away from the source tree: only the installed package is there
    home.mkdir()
    where = run(
        venv / "bin" / "python",
        "-c",
        "import receiver; print(receiver.__file__)",
        cwd=home,
        env=env,
    )
    assert where.strip().startswith(str(venv)), where

    receiver = venv / "bin" / "receiver"
    store = f"sqlite:///{home}/receipts.db"
    migrated = run(receiver, "migrate", "--store", store, cwd=home, env=env)
    assert "applied 0001_initial" in migrated
    assert "schema up to date" in run(
        receiver, "migrate", "--check", "--store", store, cwd=home, env=env
    )

    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(
        [receiver, "serve", "--port", str(port), "--store", store],
        cwd=home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
                break
            except httpx.HTTPError:
                assert server.poll() is None, Path(log.name).read_text()
                assert time.monotonic() < deadline, Path(log.name).read_text()
                time.sleep(0.2)
        secret = re.search(r"export RECEIVER_SECRET=(whsec_\S+)", Path(log.name).read_text())
        assert secret, Path(log.name).read_text()
        url = f"http://127.0.0.1:{port}/demo"
        sent = run(
            receiver,
            "send",
            "--url",
            url,
            "--secret",
            secret.group(1),
            "--id",
            "msg_1",
            cwd=home,
            env=env,
        )
        assert "HTTP 200" in sent, sent
    finally:
        server.terminate()
        server.wait(timeout=10)
