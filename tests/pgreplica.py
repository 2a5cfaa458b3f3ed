"""A primary and a streaming standby built from the installed PostgreSQL binaries, on free
loopback ports, for the failover tests.

The standby is a ``pg_basebackup -R`` of the primary that streams its WAL. With
``synchronous=True`` the primary names it in ``synchronous_standby_names``: a commit returns
only once the standby has flushed it, so a promoted standby holds every acknowledged commit.
Without it replication is asynchronous: a commit returns before the standby has it.

:meth:`Replicated.fail_over` is what an operator or an HA manager (Patroni, pg_auto_failover)
does when the primary dies: the primary stops at once (``pg_ctl stop -m immediate``, as a
crash) and the standby is promoted. The store URL names both hosts with
``target_session_attrs=read-write``, so a client finds whichever one is the primary.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import asyncpg

from tests import pgcluster

STANDBY_NAME = "standby1"


class Replicated:
    """A primary and one streaming standby; :attr:`url` names both, read-write first."""

    def __init__(self, *, synchronous: bool) -> None:
        bindir = pgcluster.find_bindir()
        if bindir is None:
            raise RuntimeError(pgcluster.HOW_TO_FIX)
        self.synchronous = synchronous
        self.primary = pgcluster.Cluster(bindir)
        self.standby = pgcluster.Cluster(bindir)
        self.promoted = False

    def start(self) -> None:
        self.primary.init()
        settings = ["wal_level = replica", "max_wal_senders = 5", "wal_keep_size = '256MB'"]
        if self.synchronous:
            settings.append(f"synchronous_standby_names = '{STANDBY_NAME}'")
        with (self.primary.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(settings) + "\n")
        self.primary.start()
        # initdb --auth=trust allows replication connections from 127.0.0.1 already.
        self.standby.datadir.parent.mkdir(parents=True, exist_ok=True)
        source = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"
        )
        self.primary.run(  # as the postgres user, which owns the standby's directory too
            "pg_basebackup", "-d", source, "-D", str(self.standby.datadir), "-R", "-X", "stream"
        )
        # Once promoted, the standby is a primary with no standby of its own: it must not wait
        # for one (an HA manager does the same: Patroni and pg_auto_failover drop to
        # asynchronous when no standby is left), or every commit would hang.
        with (self.standby.datadir / "postgresql.conf").open("a") as conf:
            conf.write("synchronous_standby_names = ''\n")
        self.standby.start()
        asyncio.run(self._wait_streaming())

    async def _wait_streaming(self, within: float = 30.0) -> None:
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + within
        while True:
            conn = await asyncpg.connect(self.primary.url, timeout=5)
            try:
                row = await conn.fetchrow(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
                    STANDBY_NAME,
                )
            finally:
                await conn.close()
            if row is not None and (row["state"], row["sync_state"]) == ("streaming", wanted):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not streaming ({wanted}) after {within} s")
            await asyncio.sleep(0.1)

    def url(self, database: str = "postgres") -> str:
        """Both hosts; a client connects to whichever accepts writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def primary_url(self, database: str = "postgres") -> str:
        """The current primary alone (for the tests' own checks)."""
        cluster = self.standby if self.promoted else self.primary
        return pgcluster.with_database(cluster.url, database)

    def kill_primary(self) -> None:
        """The primary dies: an immediate shutdown, no checkpoint, clients cut off."""
        self.primary.stop("immediate")

    def promote(self) -> None:
        self.standby.run("pg_ctl", "-D", str(self.standby.datadir), "-w", "promote")
        self.promoted = True

    def fail_over(self) -> None:
        self.kill_primary()
        self.promote()

    def destroy(self) -> None:
        for cluster in (self.primary, self.standby):
            cluster.destroy()


def replicated(*, synchronous: bool) -> Replicated:
    pair = Replicated(synchronous=synchronous)
    try:
        pair.start()
    except (subprocess.SubprocessError, OSError, RuntimeError):
        pair.destroy()
        raise
    return pair
