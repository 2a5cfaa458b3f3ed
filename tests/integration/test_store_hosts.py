"""A store URL that names several hosts, when the first host's address is answered by another
PostgreSQL server (as after a failover: an orchestrator's fresh instance, or another cluster on
a reused port) that lacks the receiver's database. asyncpg stops at the first host that answers
with an error, so the store reported "the database does not exist" (3D000) while another host
served it: now every host is tried, the diagnosis is the database's only when every host gives
it, and otherwise the store is unavailable (503, retried), never misconfigured."""

from __future__ import annotations

import logging
import socket
import urllib.parse
from collections.abc import Iterator

import pytest

from receiver import Connection, Event, PostgresStore, Provider, Receiver
from receiver._store.hosts import hosts_of
from tests import pgcluster
from tests.integration.test_store_errors import alerts, deliver, store_errors
from tests.support import PROVIDER, SECRET


@pytest.fixture(scope="module")
def stranger() -> Iterator[pgcluster.Cluster]:
    """Another PostgreSQL server, without the receiver's database."""
    bindir = pgcluster.find_bindir()
    assert bindir is not None, pgcluster.HOW_TO_FIX
    cluster = pgcluster.Cluster(bindir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def two_hosts(first: int, url: str, database: str | None = None) -> str:
    """``url`` with the host ``127.0.0.1:first`` named before its own."""
    parts = urllib.parse.urlsplit(url)
    user, _, here = parts.netloc.rpartition("@")
    path = parts.path if database is None else f"/{database}"
    netloc = f"{user}@127.0.0.1:{first},{here}"
    return parts._replace(
        netloc=netloc, path=path, query="target_session_attrs=read-write"
    ).geturl()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def receiver(url: str) -> Receiver:
    rx = Receiver(PostgresStore(url, connect_timeout=2), [Provider(PROVIDER, [SECRET])])

    @rx.on("order.*")
    async def handle(event: Event, tx: Connection) -> dict[str, bool]:
        return {"ok": True}

    return rx


def test_the_hosts_of_a_store_url() -> None:
    assert hosts_of("postgresql://u@a:5433,b,[::1]:6000/db?x=1") == [
        ("a", 5433),
        ("b", 5432),
        ("::1", 6000),
    ]
    assert hosts_of("host=a dbname=b") == []


async def test_another_server_on_the_first_address_is_not_a_missing_database(
    stranger: pgcluster.Cluster, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    rx = receiver(two_hosts(stranger.port, pg_url))
    async with rx:
        answer = await deliver(rx, "msg_hosts_1")
        assert answer.status_code == 200, answer.text
    assert not any("does not exist" in line for line in alerts(caplog)), alerts(caplog)


async def test_no_host_serving_the_database_is_unavailable_not_misconfigured(
    stranger: pgcluster.Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The stranger on the first address, nothing on the second (the promoted standby not up).
    url = two_hosts(stranger.port, f"postgresql://postgres@127.0.0.1:{closed_port()}/orders")
    rx = receiver(url)
    async with rx:
        answer = await deliver(rx, "msg_hosts_2")
        assert answer.status_code == 503, answer.text
        assert store_errors(rx, "unavailable") >= 1
        assert store_errors(rx, "misconfigured") == 0
    assert not any("does not exist" in line for line in alerts(caplog)), alerts(caplog)


async def test_every_host_without_the_database_is_still_a_missing_database(
    stranger: pgcluster.Cluster, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rx = receiver(two_hosts(stranger.port, pg_url, database="receiver_nowhere"))
    async with rx:
        answer = await deliver(rx, "msg_hosts_3")
        assert answer.status_code == 503, answer.text
        assert store_errors(rx, "misconfigured") >= 1
    assert any("does not exist" in line for line in alerts(caplog)), alerts(caplog)
