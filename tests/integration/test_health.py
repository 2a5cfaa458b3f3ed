"""GET /healthz (alive: no store access) and GET /readyz (store reachable, schema present), with
the store up, down, and up without its schema."""

from __future__ import annotations

import os
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from receiver import PostgresStore, Provider, Receiver, SQLiteStore, Store
from tests import pgcluster
from tests.pgcluster import free_port
from tests.support import PROVIDER, SECRET


def client(rx: Receiver) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://test")


def unreachable(kind: str, tmp_path: Path) -> Store:
    if kind == "postgresql":
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/x"
        return PostgresStore(url, connect_timeout=1)
    return SQLiteStore(tmp_path / "missing-dir" / "receipts.db")


async def test_both_answer_200_with_the_store_up(store: Store) -> None:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])])
    async with client(rx) as c:
        alive = await c.get("/healthz")
        ready = await c.get("/readyz")
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert ready.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
async def test_store_down_is_alive_but_not_ready(kind: str, tmp_path: Path) -> None:
    rx = Receiver(unreachable(kind, tmp_path), [Provider(PROVIDER, [SECRET])])
    async with client(rx) as c:
        started = time.monotonic()
        alive = await c.get("/healthz")
        assert time.monotonic() - started < 0.5  # never waits for the store
        ready = await c.get("/readyz")
    assert alive.status_code == 200
    assert ready.status_code == 503
    assert ready.headers["retry-after"] == "5"
    assert ready.json() == {"status": "not_ready", "detail": "the store is unavailable"}


async def test_a_database_without_the_schema_is_not_ready(pg_admin_url: str) -> None:
    name = f"receiver_empty_{os.getpid()}"
    url = await pgcluster.recreate_database(pg_admin_url, name)
    try:
        async with PostgresStore(url) as store:
            rx = Receiver(store, [Provider(PROVIDER, [SECRET])])
            async with client(rx) as c:
                before = await c.get("/readyz")
                await store.migrate()
                after = await c.get("/readyz")
    finally:
        await pgcluster.drop_database(pg_admin_url, name)
    assert before.status_code == 503
    assert "receiver migrate" in before.json()["detail"]
    assert "UndefinedTable" in before.json()["detail"]
    assert after.status_code == 200


async def test_readyz_reads_no_receipt(pg_store: PostgresStore, pg_url: str) -> None:
    """A receipt row locked by a long transaction does not slow readiness down."""
    rx = Receiver(pg_store, [Provider(PROVIDER, [SECRET])])
    locker = await asyncpg.connect(pg_url)
    try:
        await locker.execute(
            "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state,"
            " claimed_at, lease_until, expires_at) VALUES ('acme', 'msg_1', '\\x00',"
            " 'in_flight', now(), now(), now() + interval '1 hour')"
        )
        async with locker.transaction():
            await locker.execute("SELECT * FROM receiver_receipts FOR UPDATE")
            async with client(rx) as c:
                started = time.monotonic()
                ready = await c.get("/readyz")
                assert time.monotonic() - started < 1
    finally:
        await locker.close()
    assert ready.status_code == 200


async def test_health_can_be_turned_off(store: Store) -> None:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], health=False)
    async with client(rx) as c:
        # Only /{provider} is left, and no provider has those names.
        assert (await c.get("/healthz")).status_code == 404
        assert (await c.get("/readyz")).status_code == 404


async def test_mounted_under_a_prefix(store: Store) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    rx = Receiver(store, [Provider(PROVIDER, [SECRET])])
    host = Starlette(routes=[Mount("/webhooks", rx)], lifespan=rx.lifespan)
    async with (
        host.router.lifespan_context(host),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=host), base_url="http://t") as c,
    ):
        assert (await c.get("/webhooks/healthz")).status_code == 200
        assert (await c.get("/webhooks/readyz")).status_code == 200
        assert (await c.get("/webhooks/metrics")).status_code == 200
