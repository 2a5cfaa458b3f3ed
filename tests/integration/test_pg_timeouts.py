"""What bounds a handler stuck inside its transaction (issue 20, "Also"): the database's
``idle_in_transaction_session_timeout``, set for the receiver's role or database (it works the
same behind a transaction-mode pooler, where a session setting would not). The stuck attempt is
ended by the server, its row locks are freed at once, and the delivery runs again."""

from __future__ import annotations

import asyncio
import os

import asyncpg
import httpx

from receiver import Event, PostgresStore, Provider, Receiver
from receiver._store.base import Connection
from tests import pgcluster
from tests.support import PROVIDER, SECRET, body_of, signed


async def test_a_handler_stuck_in_its_transaction_cannot_hold_its_locks(
    pg_admin_url: str,
) -> None:
    name = f"receiver_test_timeout_{os.getpid()}"
    url = await pgcluster.recreate_database(pg_admin_url, name)
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f"ALTER DATABASE {name} SET idle_in_transaction_session_timeout = '1s'")
        async with PostgresStore(url) as store:
            await store.migrate()
            async with store.acquire() as conn:
                await conn.execute("CREATE TABLE stock (sku TEXT PRIMARY KEY, left_ INT)")
                await conn.execute("INSERT INTO stock VALUES ('s-1', 10)")
        rx = Receiver(
            PostgresStore(url), [Provider(PROVIDER, [SECRET], lease=2.0)], sweep_interval=None
        )
        stuck = [True, False]

        @rx.on("order.created")
        async def reserve(event: Event, tx: Connection) -> None:
            await tx.execute("UPDATE stock SET left_ = left_ - 1 WHERE sku = 's-1'")
            if stuck.pop(0):
                await asyncio.sleep(3)  # a downstream call that hangs, the row lock held

        body = body_of("order.created", order="o-1")
        async with (
            rx,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://t") as client,
        ):
            first = asyncio.create_task(
                client.post(f"/{PROVIDER}", content=body, headers=signed("msg_t", body))
            )
            await asyncio.sleep(1.6)  # past the timeout: the server ended the stuck session
            other = await asyncpg.connect(url)
            try:  # the row is free: no wait behind the stuck handler
                await other.execute("SET lock_timeout = '200ms'")
                await other.execute("UPDATE stock SET left_ = left_ WHERE sku = 's-1'")
            finally:
                await other.close()
            answer = await first
            assert answer.status_code in (500, 503)  # never a 2xx for a rolled-back attempt
            await asyncio.sleep(1.0)  # the dead attempt's 2 s lease runs out
            again = await client.post(f"/{PROVIDER}", content=body, headers=signed("msg_t", body))
            assert again.status_code == 200
        check = await asyncpg.connect(url)
        try:
            assert await check.fetchval("SELECT left_ FROM stock") == 9  # reserved once
        finally:
            await check.close()
    finally:
        await admin.close()
        await pgcluster.drop_database(pg_admin_url, name)
