"""A receiver started while its PostgreSQL is unreachable (through a real TCP gate that is
closed, then opened): the schema check runs when the store first answers, before any delivery
is accepted, so a database that comes back on an older schema is never served on; and the
sweeper waits for the startup hooks, as the workers do, so it never recovers a receipt with a
handler whose tables the hooks have not made yet."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator

import asyncpg
import pytest

from receiver import Connection, Event, PostgresStore, Provider, Receiver
from receiver._verification.payload import parse
from tests import pgcluster
from tests.conftest import prepared_database
from tests.support import PROVIDER, SECRET, body_of, signed


class Gate:
    """A TCP forwarder to the database's port: closed (connections refused) until opened."""

    def __init__(self, target: str) -> None:
        parts = urllib.parse.urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 5432
        with socket.socket() as probe:  # a free port, listened on only while the gate is open
            probe.bind(("127.0.0.1", 0))
            self.listen_port = probe.getsockname()[1]
        self.url = parts._replace(netloc=f"{parts.username}@127.0.0.1:{self.listen_port}").geturl()
        self._server: asyncio.Server | None = None

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.listen_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))


@pytest.fixture
async def database(pg_admin_url: str) -> AsyncIterator[str]:
    name = f"receiver_test_outage_{os.getpid()}"
    url = await prepared_database(pg_admin_url, name)
    yield url
    await pgcluster.drop_database(pg_admin_url, name)


async def sql(url: str, statement: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(statement, *args)
    finally:
        await conn.close()


async def test_a_database_back_on_an_older_schema_is_never_served_on(database: str) -> None:
    # The database the server will find when it comes back lacks the newest migration.
    newest = await sql(
        database, "DELETE FROM receiver_migrations WHERE version = "
        "(SELECT max(version) FROM receiver_migrations) RETURNING version, name, checksum"
    )  # fmt: skip
    gate = Gate(database)
    rx = Receiver(PostgresStore(gate.url), [Provider(PROVIDER, [SECRET])], sweep_interval=None)
    ran: list[str] = []

    @rx.on_startup
    async def hook(conn: Connection) -> None:
        ran.append("hook")

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        ran.append("handler")

    body = body_of(id="o1")
    async with rx.lifespan():
        assert (await rx.deliver(PROVIDER, signed("m1", body), body)).status_code == 503
        await gate.open()  # the database is back, on its older schema
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # long past the first retries (0.25 s, 0.5 s, ...)
            answer = await rx.deliver(PROVIDER, signed("m1", body), body)
            assert answer.status_code == 503, answer.body
            await asyncio.sleep(0.1)
        assert b"misconfigured" in answer.body  # the log line says: run receiver migrate
        assert ran == []
        # Migrated meanwhile: the next check passes, the hooks run, deliveries are served.
        row = newest[0]
        await sql(
            database,
            "INSERT INTO receiver_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            row["version"], row["name"], row["checksum"],
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while (answer := await rx.deliver(PROVIDER, signed("m1", body), body)).status_code == 503:
            assert time.monotonic() < deadline, answer.body
            await asyncio.sleep(0.1)
        assert answer.status_code == 200
    await gate.close()
    assert ran == ["hook", "handler"]


async def test_the_sweeper_waits_for_the_startup_hooks(database: str) -> None:
    # A delivery left in flight by a process that died: its lease long over.
    body = body_of(id="o7")
    payload_hash = parse(body, None).payload_hash
    await sql(
        database,
        "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state, fence, "
        "event_type, claimed_at, lease_until, expires_at, request_body, attempts) VALUES "
        "($1, 'stale-1', $2, 'in_flight', 1, 'order.created', now() - interval '1 hour', "
        "now() - interval '59 minutes', now() + interval '1 day', $3, 1)",
        PROVIDER, payload_hash, body,
    )  # fmt: skip
    gate = Gate(database)
    rx = Receiver(PostgresStore(gate.url), [Provider(PROVIDER, [SECRET])], sweep_interval=0.05)
    order: list[str] = []
    release = asyncio.Event()

    @rx.on_startup
    async def hook(conn: Connection) -> None:
        order.append("hook started")
        await release.wait()  # a slow migration of the handler's own tables
        order.append("hook done")

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> None:
        order.append(f"handler {event.id}")

    async with rx.lifespan():  # the database is down: the hooks are deferred
        await gate.open()
        deadline = time.monotonic() + 10
        while "hook started" not in order:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # twenty sweeper intervals
        release.set()
        deadline = time.monotonic() + 10
        while "handler stale-1" not in order:
            assert time.monotonic() < deadline, order
            await asyncio.sleep(0.05)
    await gate.close()
    assert order == ["hook started", "hook done", "handler stale-1"]
