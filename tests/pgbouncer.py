"""A real PgBouncer for the pooler tests, started the way tests/pgcluster.py starts PostgreSQL:
Debian's ``pgbouncer`` (installed by scripts/ensure-tools), on a free loopback port, in front of
the test server, in transaction or session pooling mode. Never a mock: the point is what a
real pooler does to prepared statements and sessions."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

from tests.pgcluster import free_port

HOW_TO_FIX = "pgbouncer is missing: run scripts/ensure-tools (apt-get install pgbouncer)"


def find_pgbouncer() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        raise RuntimeError(HOW_TO_FIX)
    return found


class PgBouncer:
    """One PgBouncer process in ``mode`` (``transaction`` or ``session``) in front of the
    server of ``server_url``, listening on 127.0.0.1:``port``."""

    def __init__(self, server_url: str, mode: str) -> None:
        self.server = urllib.parse.urlsplit(server_url)
        self.mode = mode
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"receiver-pgbouncer-{mode}-"))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        user = self.server.username or "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        host = self.server.hostname or "127.0.0.1"
        port = self.server.port or 5432
        user = self.server.username or "postgres"
        ini = self.root / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port} user={user}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "auth_type = any\n"  # the test server trusts loopback; nothing secret here
            f"pool_mode = {self.mode}\n"
            "unix_socket_dir =\n"
            "max_client_conn = 1000\n"
            "default_pool_size = 40\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
        )
        command = [find_pgbouncer(), str(ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            os.chown(ini, pw.pw_uid, pw.pw_gid)
            command[1:1] = ["-u", "postgres"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.process.stderr.read()!r}")  # type: ignore[union-attr]
            log = self.root / "pgbouncer.log"
            if log.exists() and "listening on" in log.read_text():
                return
            time.sleep(0.05)
        raise RuntimeError("pgbouncer did not start listening within 10 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)
