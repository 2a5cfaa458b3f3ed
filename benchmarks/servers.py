"""uvicorn processes on identical settings, and what they cost: CPU time and resident memory.

Both the receiver and the bare endpoint run as
``python -m uvicorn MODULE:app --workers N --loop uvloop --http httptools --no-access-log
--log-level warning``. With more than one worker, uvicorn's supervisor process spawns the
workers; CPU and memory are read for the whole process tree from /proc.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        except OSError:
            continue
        found.extend(int(x) for x in text.split())
    return found


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo.extend(_children(current))
    return pids


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time of live processes."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICKS


def machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy (all cores; not idle, not waiting on I/O)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    return (sum(fields[:8]) - idle - steal) / _TICKS


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of one process in KiB: resident now, and its peak."""
    rss = hwm = 0
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return rss, hwm


def postgres_pids(database: str) -> list[int]:
    """PostgreSQL's background processes and the backends connected to ``database``, found by
    their process titles ("postgres: [CLUSTER:] USER DATABASE HOST(PORT) STATE"): not the
    backends of other databases, which other work on the machine may be using."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            title = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            continue
        if not comm.startswith("postgres"):
            continue
        client = next(
            (i for i, t in enumerate(title) if t == b"[local]" or (t.endswith(b")") and b"(" in t)),
            None,
        )
        if client is None or client < 1 or title[client - 1] == database.encode():
            pids.append(int(entry))
    return pids


class Server:
    """One uvicorn server on a free loopback port."""

    def __init__(
        self, name: str, module: str, *, workers: int, env: Mapping[str, str], log: Path
    ) -> None:
        self.name = name
        self.workers = workers
        self.port = free_port()
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                f"{module}:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--log-level",
                "warning",
                "--lifespan",
                "on",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.output()}")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                conn.request("GET", "/bench")
                conn.getresponse().read()
            except OSError:
                time.sleep(0.05)
                continue
            finally:
                conn.close()
            # With several workers, give every worker time to start before measuring.
            if self.workers > 1:
                while len(self.workers_pids()) < self.workers and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(0.5)
            return
        self.stop()
        raise RuntimeError(f"{self.name} did not start in {timeout} s:\n{self.output()}")

    def pids(self) -> list[int]:
        return process_tree(self.process.pid)

    def workers_pids(self) -> list[int]:
        """The processes that serve requests: the server itself, or the supervisor's children
        (uvicorn's spawn-based workers, without multiprocessing's helper processes)."""
        if self.workers == 1:
            return [self.process.pid]
        return [pid for pid in _children(self.process.pid) if _is_worker(pid)]

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pids())

    def memory_kib(self) -> tuple[int, int]:
        """(sum of VmRSS, max of VmHWM) over the worker processes."""
        values = [memory_kib(pid) for pid in self.workers_pids()]
        return sum(v[0] for v in values), max((v[1] for v in values), default=0)

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log_file.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"resource_tracker" not in cmdline


class MemorySampler:
    """Samples a server's resident memory every ``interval`` seconds in a thread."""

    def __init__(self, server: Server, interval: float = 1.0) -> None:
        self.server = server
        self.interval = interval
        self.samples: list[tuple[float, int]] = []  # (seconds since start, KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, _ = self.server.memory_kib()
            self.samples.append((time.monotonic() - self._started, rss))
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
