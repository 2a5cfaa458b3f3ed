"""PostgreSQL failures that are not a blip, on a real server: a read-only database (a failover
to a standby), a revoked role, a database that does not exist, an unknown role, and a database
without the ledger's tables (`receiver migrate` never run). Each delivery is answered 503 with
Retry-After (never a bare 500), counted by kind, and logged with what to fix, at start-up and on
every delivery; /readyz answers 503 and says the same. A handler's own query failing the same
way stays the handler's failure (500, released)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from receiver import Connection, Event, PostgresStore, Provider, Receiver
from receiver._exceptions import SchemaOutdated
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key, State
from tests import pgcluster
from tests.support import PROVIDER, SECRET, body_of, signed

PID = os.getpid()


@pytest.fixture
async def database(pg_admin_url: str) -> AsyncIterator[str]:
    """A throwaway database with the ledger's tables."""
    name = f"receiver_faults_{PID}"
    url = await pgcluster.recreate_database(pg_admin_url, name)
    async with PostgresStore(url) as store:
        await store.migrate()
    yield url
    await pgcluster.drop_database(pg_admin_url, name)


def receiver(url: str) -> Receiver:
    rx = Receiver(PostgresStore(url, connect_timeout=2), [Provider(PROVIDER, [SECRET])])

    @rx.on("order.*")
    async def handle(event: Event, tx: Connection) -> dict[str, bool]:
        if event.payload["data"].get("query"):
            await tx.execute(event.payload["data"]["query"])
        return {"ok": True}

    return rx


async def deliver(rx: Receiver, webhook_id: str, **data: object) -> httpx.Response:
    body = body_of("order.created", **data)
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post(f"/{PROVIDER}", content=body, headers=signed(webhook_id, body))


async def ready(rx: Receiver) -> httpx.Response:
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/readyz")


def store_errors(rx: Receiver, kind: str) -> float:
    assert rx.metrics is not None
    value = rx.metrics.registry.get_sample_value(
        "receiver_store_errors_total", {"provider": PROVIDER, "kind": kind}
    )
    return value or 0.0


def alerts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.getMessage().startswith("ALERT")
    ]


async def refused(
    rx: Receiver, caplog: pytest.LogCaptureFixture, kind: str, fix: str, webhook_id: str
) -> None:
    """The delivery is answered 503 with Retry-After, counted, and logged with the fix."""
    caplog.clear()
    answer = await deliver(rx, webhook_id)
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == str(rx.pipeline.retry_after)
    assert answer.json()["error"] == "store_unavailable"
    assert store_errors(rx, kind) >= 1
    assert any(fix in line for line in alerts(caplog)), alerts(caplog)
    readiness = await ready(rx)
    assert readiness.status_code == 503
    assert fix in readiness.json()["detail"]


async def test_a_read_only_database_is_503_and_not_ready(
    database: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = database.rpartition("/")[2]
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    finally:
        await admin.close()
    rx = receiver(database)
    async with rx:
        assert any("read-only" in line for line in alerts(caplog))  # at start-up
        await refused(rx, caplog, "read_only", "read-only", "msg_ro")
        assert store_errors(rx, "misconfigured") == 0


async def test_a_revoked_role_is_503_with_the_grant_to_run(
    database: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"receiver_role_{PID}"
    admin = await asyncpg.connect(database)  # as the superuser, in the throwaway database
    tables = "receiver_receipts, receiver_attempts"
    try:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        # SELECT on every table (the ledger's, and any bookkeeping of the schema's version),
        # the writes on the ledger's.
        await admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        await admin.execute(f'GRANT INSERT, UPDATE, DELETE ON {tables} TO "{role}"')
        url = database.replace("postgres@", f"{role}@", 1)
        assert url != database
        rx = receiver(url)
        async with rx:
            assert (await deliver(rx, "msg_before")).status_code == 200
            assert (await ready(rx)).status_code == 200
            await admin.execute(f'REVOKE INSERT, UPDATE, DELETE ON {tables} FROM "{role}"')
            await refused(rx, caplog, "misconfigured", "GRANT SELECT, INSERT", "msg_after")
    finally:
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.close()
        await _drop_role(pg_admin_url, role)


async def _drop_role(admin_url: str, role: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        await admin.close()


async def test_a_database_that_does_not_exist_is_503(
    pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rx = receiver(pgcluster.with_database(pg_admin_url, f"receiver_never_created_{PID}"))
    async with rx:
        assert any("does not exist" in line for line in alerts(caplog))  # at start-up
        await refused(rx, caplog, "misconfigured", "the database does not exist", "msg_1")


async def test_a_dropped_database_is_503(
    database: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rx = receiver(database)
    async with rx:
        assert (await deliver(rx, "msg_before")).status_code == 200
        await pgcluster.drop_database(pg_admin_url, database.rpartition("/")[2])
        await refused(rx, caplog, "misconfigured", "the database does not exist", "msg_after")


async def test_an_unknown_role_is_503(pg_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    rx = receiver(pg_admin_url.replace("postgres@", f"no_such_role_{PID}@", 1))
    async with rx:
        await refused(rx, caplog, "misconfigured", "refused the role", "msg_1")


@pytest.mark.parametrize("setting", ["no_such_setting=1", "statement_timeout=soon"])
async def test_a_setting_in_the_url_the_server_refuses_is_503_with_the_fix(
    database: str, caplog: pytest.LogCaptureFixture, setting: str
) -> None:
    # asyncpg sends a query parameter it does not take to the server as a setting.
    rx = receiver(f"{database}?{setting}")
    async with rx:
        await refused(rx, caplog, "misconfigured", "refused a setting the store URL passes", "m1")


async def test_tables_dropped_while_serving_say_run_receiver_migrate(
    database: str, caplog: pytest.LogCaptureFixture
) -> None:
    rx = receiver(database)
    async with rx:
        assert (await deliver(rx, "msg_before")).status_code == 200
        admin = await asyncpg.connect(database)
        try:
            await admin.execute("DROP TABLE receiver_receipts, receiver_attempts")
        finally:
            await admin.close()
        await refused(rx, caplog, "misconfigured", "run `receiver migrate`", "msg_after")
        assert rx.metrics is not None
        delivered = rx.metrics.registry.get_sample_value(
            "receiver_deliveries_total",
            {"provider": PROVIDER, "outcome": "store_unavailable", "reason": ""},
        )
        assert delivered == 1


async def test_starting_without_the_tables_says_run_receiver_migrate(
    pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"receiver_unmigrated_{PID}"
    url = await pgcluster.recreate_database(pg_admin_url, name)
    try:
        rx = receiver(url)
        # Start-up refuses to serve (the schema is older than this version), naming the fix.
        with pytest.raises(SchemaOutdated, match="receiver migrate"):
            await rx.open()
        # Mounted without its lifespan, it still answers 503, never 500: its first delivery
        # tries to open it again, and is refused with the same fix.
        await refused(rx, caplog, "misconfigured", "receiver migrate", "msg_1")
        await rx.close()
    finally:
        await pgcluster.drop_database(pg_admin_url, name)


async def test_a_handlers_own_missing_table_is_its_failure_not_the_stores(
    database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same SQLSTATE from the handler's own query is no misconfiguration of the store: 500,
    the claim released with the error kept, nothing counted as a store error."""
    rx = receiver(database)
    async with rx:
        answer = await deliver(rx, "msg_1", query="INSERT INTO no_such_table VALUES (1)")
        assert answer.status_code == 500, answer.text
        assert store_errors(rx, "misconfigured") == 0
        async with rx.store.acquire() as conn:
            found = await ledger.lookup(conn, Key(PROVIDER, "msg_1"))
    assert found is not None
    assert found.state is State.RELEASED
    assert found.last_error is not None
    assert "UndefinedTableError" in found.last_error


async def test_a_ledger_statement_the_server_asks_to_retry_is_503_then_runs_once(
    database: str,
) -> None:
    """SQLSTATE 40001 (CockroachDB's and YugabyteDB's "restart transaction", PostgreSQL's
    serialization failure) and 40P01 (deadlock) on the ledger's own claim: 503 with
    Retry-After, nothing claimed; once the server takes it, the retry runs the handler once."""
    admin = await asyncpg.connect(database)
    runs: list[str] = []
    try:
        for state in ("40001", "40P01"):
            await admin.execute(
                f"""
                CREATE OR REPLACE FUNCTION refuse_claim() RETURNS trigger AS $$
                BEGIN RAISE EXCEPTION 'retry' USING ERRCODE = '{state}'; END
                $$ LANGUAGE plpgsql;
                CREATE OR REPLACE TRIGGER refuse_claim BEFORE INSERT ON receiver_receipts
                FOR EACH ROW EXECUTE FUNCTION refuse_claim();
                """
            )
            rx = Receiver(PostgresStore(database), [Provider(PROVIDER, [SECRET])])

            @rx.on("order.*")
            async def handle(event: Event, tx: Connection) -> None:
                runs.append(event.id)

            async with rx:
                answer = await deliver(rx, f"msg_retry_{state}")
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"] == str(rx.pipeline.retry_after)
                assert answer.json()["error"] == "store_unavailable"
                assert "retry" not in answer.text.replace("retry later", "")
                assert store_errors(rx, "unavailable") == 1
                claimed = "SELECT count(*) FROM receiver_receipts WHERE webhook_id = $1"
                assert await admin.fetchval(claimed, f"msg_retry_{state}") == 0
                await admin.execute("DROP TRIGGER refuse_claim ON receiver_receipts")
                assert (await deliver(rx, f"msg_retry_{state}")).status_code == 200
                assert (await deliver(rx, f"msg_retry_{state}")).status_code == 200
        assert runs == ["msg_retry_40001", "msg_retry_40P01"]
    finally:
        await admin.close()
