"""The receiver runs with only the privileges docs/how-to/postgresql.md "Privileges" lists: a
role that may read the migrations table and read and write the two ledger tables, nothing else
(not the owner, no DDL, no superuser). Deliveries, replays, the executor, the middleware, the
sweeper, the queued workers and /readyz all work as that role."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client import CollectorRegistry

from receiver import Actions, Event, PostgresStore, Provider, Receiver, ToolCall
from receiver._store import partitions
from receiver._store.base import Connection
from tests import pgcluster
from tests.support import PROVIDER, SECRET, body_of, signed

GRANTS = """
GRANT CONNECT ON DATABASE {db} TO {role};
GRANT USAGE ON SCHEMA public TO {role};
GRANT SELECT ON receiver_migrations TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON receiver_receipts, receiver_attempts TO {role};
GRANT SELECT, INSERT ON app_orders TO {role};
"""


@pytest.mark.parametrize("layout", ["single", "partitioned"])
async def test_the_receiver_runs_with_only_the_listed_privileges(
    pg_admin_url: str, caplog: pytest.LogCaptureFixture, layout: str
) -> None:
    """On both layouts of the receipts table: the partitioned one's key table, partitions and
    sweep (which opens and drops partitions) need no privilege beyond the list either."""
    db = f"receiver_test_privileges_{layout}_{os.getpid()}"
    role = f"receiver_app_{os.getpid()}"
    owner_url = await pgcluster.recreate_database(pg_admin_url, db)
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        async with PostgresStore(owner_url) as owner:
            await owner.migrate()  # the migrations run as the owner, as in production
            async with owner.acquire() as conn:
                await partitions.convert(conn, layout)
                await conn.execute("CREATE TABLE app_orders (id TEXT PRIMARY KEY)")
                await conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
                for statement in GRANTS.format(db=db, role=role).strip().splitlines():
                    await conn.execute(statement)
        app_url = owner_url.replace("postgres@", f"{role}@", 1)
        rx = Receiver(
            PostgresStore(app_url),
            [Provider(PROVIDER, [SECRET]), Provider("queued", [SECRET], mode="queued")],
            sweep_interval=None,
        )

        @rx.on("order.created")
        async def created(event: Event, tx: Connection) -> dict[str, str]:
            await tx.execute("INSERT INTO app_orders (id) VALUES ($1)", event.id)
            return {"order": event.id}

        actions = Actions(rx, registry=CollectorRegistry())

        @actions.tool("note")
        async def note(call: ToolCall, tx: Connection) -> Any:
            return {"noted": call.action.action_id}

        async with (
            rx,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://t") as client,
        ):
            assert (await client.get("/readyz")).status_code == 200
            body = body_of("order.created", n=1)
            first = await client.post(f"/{PROVIDER}", content=body, headers=signed("p-1", body))
            again = await client.post(f"/{PROVIDER}", content=body, headers=signed("p-1", body))
            assert (first.status_code, again.status_code) == (200, 200)
            assert again.headers["idempotent-replayed"] == "true"
            queued = await client.post("/queued", content=body, headers=signed("q-1", body))
            assert queued.status_code == 202
            worker = rx.worker(concurrency=1, poll_interval=0.05)
            running = asyncio.create_task(worker.run())
            await asyncio.sleep(0.5)
            worker.stop()
            await running
            assert worker.done, "the queued delivery was not run"
            action = actions.propose("note", scope="t", action_id="a-1", request={})
            assert (await actions.execute(action)).value == {"noted": "a-1"}
            # The console's audit table is not the application's: the sweep goes on without
            # deleting old audit records, and says once what to grant.
            assert (await rx.sweep()).audit_deleted == 0
            await rx.sweep()
            if layout == "partitioned":
                # A partition opened and the receipts' one dropped, all as the ledger's role.
                async with rx.store.acquire() as conn:
                    receipts = await conn.fetchval("SELECT count(*) FROM receiver_receipts")
                await partitions.open_partition(rx.store)
                later = time.time() + 30 * 24 * 3600
                dropped = await partitions.expire(rx.store, later, 0.0, time.monotonic() + 60)
                assert dropped == receipts > 0
                async with rx.store.acquire() as conn:
                    assert await conn.fetchval("SELECT count(*) FROM receiver_receipts") == 0
        warned = [r for r in caplog.records if "receiver_audit" in r.getMessage()]
        assert len(warned) == 1
        check = await asyncpg.connect(owner_url)
        try:
            assert await check.fetchval("SELECT count(*) FROM app_orders") == 2
        finally:
            await check.close()
    finally:
        await pgcluster.drop_database(pg_admin_url, db)
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
