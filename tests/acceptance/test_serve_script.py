"""``scripts/serve``, the README's first command: the demo app (handlers/, which the package
does not ship) served from the repository, with the generated demo secret it prints working
for a signed delivery. Run with the virtualenv this suite runs in, whose stamp says it has the
runtime dependencies already (so the script installs nothing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.pgcluster import free_port
from tests.servers import ROOT

pytestmark = pytest.mark.slow


def test_scripts_serve_runs_the_demo_from_the_repository(tmp_path: Path) -> None:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RECEIVER_", "PYTHONPATH", "VIRTUAL_ENV"))
    }
    # The demo is not installed: outside the repository, nothing named handlers imports.
    elsewhere = subprocess.run(
        [sys.executable, "-c", "import handlers"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "No module named 'handlers'" in elsewhere.stderr, elsewhere.stderr
    env["VENV"] = sys.prefix
    env["RECEIVER_STORE"] = f"sqlite:///{tmp_path}/demo.db"
    log_path = tmp_path / "serve.log"
    with log_path.open("w+") as log:
        server = subprocess.Popen(
            [str(ROOT / "scripts" / "serve"), "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
                    break
                except httpx.HTTPError:
                    assert server.poll() is None, log_path.read_text()
                    assert time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.2)
            banner = log_path.read_text()
            command = re.search(
                r"^  (receiver send --url \S+ --secret \S+ --id \S+)$", banner, re.M
            )
            assert command, banner
            sent = subprocess.run(
                [str(Path(sys.prefix) / "bin" / "receiver"), *command[1].split()[1:]],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert sent.returncode == 0, sent.stdout + sent.stderr
            assert "HTTP 200" in sent.stdout
        finally:
            server.terminate()
            server.wait(timeout=10)
