"""Finding PostgreSQL for the tests, the same way on every machine.

1. ``RECEIVER_TEST_PG_URL`` (or ``DATABASE_URL``) if set;
2. else the local server at 127.0.0.1:5432 (user postgres, trust auth);
3. else a throwaway cluster started from the installed binaries (``initdb`` + ``pg_ctl``, as the
   ``postgres`` user when running as root), stopped when the tests end.

If none works the tests stop with a message saying how to fix it: PostgreSQL tests are never
skipped, because a skipped race test proves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import asyncpg

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

HOW_TO_FIX = (
    "PostgreSQL is needed by the test suite and none could be found or started.\n"
    "Fix one of:\n"
    "  - export RECEIVER_TEST_PG_URL=postgresql://user@host:port/db (a server you can CREATE "
    "DATABASE on)\n"
    "  - start the local server: pg_ctlcluster --skip-systemctl-redirect 15 main start\n"
    "  - install the server binaries so a throwaway cluster can be started: "
    "apt-get install postgresql"
)


async def _can_connect(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    await conn.close()
    return True


def can_connect(url: str) -> bool:
    return asyncio.run(_can_connect(url))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def find_bindir() -> Path | None:
    for candidate in [
        shutil.which("pg_ctl"),
        *sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")),
    ]:
        if candidate and Path(candidate).exists():
            # /usr/local/bin/pg_ctl on Debian is a wrapper; prefer the real binaries beside initdb.
            real = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
            return Path(real[-1]).parent if real else Path(candidate).parent
    return None


class Cluster:
    """A throwaway PostgreSQL cluster in a temporary directory, on a free loopback port."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="receiver-pg-"))
        self.datadir = self.root / "data"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            # initdb refuses to run as root.
            self.user = "postgres"
            pw = pwd.getpwnam(self.user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self.run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def start(self) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self.run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-o",
            opts,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> Cluster:
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError(HOW_TO_FIX)
    cluster = Cluster(bindir)
    cluster.init()
    cluster.start()
    return cluster


def find_server() -> tuple[str, Cluster | None]:
    """The admin URL of a server, and the cluster to stop afterwards if we started one."""
    url = os.environ.get("RECEIVER_TEST_PG_URL") or os.environ.get("DATABASE_URL")
    if url:
        if not can_connect(url):
            raise RuntimeError(f"cannot connect to {url} (from the environment).\n{HOW_TO_FIX}")
        return url, None
    if can_connect(LOCAL_URL):
        return LOCAL_URL, None
    try:
        cluster = start_cluster()
    except (RuntimeError, subprocess.SubprocessError, OSError, KeyError) as exc:
        raise RuntimeError(f"{HOW_TO_FIX}\n(starting a throwaway cluster failed: {exc})") from exc
    return cluster.url, cluster


def with_database(url: str, database: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{database}"


async def recreate_database(admin_url: str, database: str) -> str:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()
    return with_database(admin_url, database)


async def drop_database(admin_url: str, database: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await conn.close()
