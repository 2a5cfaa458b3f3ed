"""A Prefect API server for the experiment: ``prefect server start`` on loopback, its database a
SQLite file in a temporary directory, no UI, no scheduler, no analytics. One server serves every
worker process (each would otherwise start an ephemeral server of its own, ~10 s each)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def environment(home: Path, api_url: str | None = None) -> dict[str, str]:
    """What every Prefect process of the experiment runs with: a home of its own, nothing
    sent anywhere, the server's URL (when one is given)."""
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_LOGGING_TO_API_ENABLED": "false",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "results"),
        "DO_NOT_TRACK": "1",
    }
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    return env


@contextmanager
def prefect_server(home: Path, timeout: float = 120.0) -> Iterator[dict[str, str]]:
    """Start the server; yield the environment its clients need; stop it."""
    home.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **environment(home)}
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--no-ui", "--no-services"]
    with (home / "server.log").open("wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2) as answer:  # noqa: S310
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the Prefect server did not start:\n"
                    + (home / "server.log").read_text(errors="replace")[-3000:]
                )
            time.sleep(0.2)
        yield environment(home, api)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
