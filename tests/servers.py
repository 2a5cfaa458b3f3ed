"""Real server processes for acceptance tests: ``receiver serve`` on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.pgcluster import free_port

ROOT = Path(__file__).resolve().parent.parent
RECEIVER = str(Path(sys.executable).parent / "receiver")


class Server:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(
    env: Mapping[str, str], log: Path, *, app: str = "tests.apps.server:app", workers: int = 1
) -> Server:
    port = free_port()
    handle = log.open("wb")
    process = subprocess.Popen(
        [
            RECEIVER,
            "serve",
            "--app",
            app,
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    server = Server(process, port, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.output()}")
        try:
            httpx.get(f"{server.url}/", timeout=0.5)
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"server did not start in 30 s:\n{server.output()}")


@contextmanager
def running(env: Mapping[str, str], log: Path, **kw: object) -> Iterator[Server]:
    server = start_server(env, log, **kw)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def start_worker(
    env: Mapping[str, str],
    log: Path,
    *,
    app: str = "tests.apps.queued:rx",
    concurrency: int = 8,
    grace: float = 30.0,
) -> subprocess.Popen[bytes]:
    """``receiver worker`` as a real process (queued mode); the caller stops or kills it."""
    handle = log.open("ab")
    return subprocess.Popen(
        [
            RECEIVER,
            "worker",
            "--app",
            app,
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            "0.2",
            "--grace",
            str(grace),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
