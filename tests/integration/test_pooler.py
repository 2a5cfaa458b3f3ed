"""The receiver behind a real PgBouncer, in transaction and in session pooling mode (issue 20):
it starts, the race of 100 copies through one barrier still runs one handler, the executor and
the middleware keep one effect per key, queued workers drain exactly once, and a store that is
not told about a transaction-mode pooler fails with an error that names the fix."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver import (
    Actions,
    ConfigurationError,
    Event,
    IdempotencyKeyMiddleware,
    PostgresStore,
    Provider,
    Receiver,
    StoreMisconfigured,
    ToolCall,
)
from receiver._store import partitions
from receiver._store.base import Connection
from tests import pgcluster
from tests.conftest import POOLED_DATABASE, prepared_database, truncate
from tests.pgbouncer import PgBouncer
from tests.support import PROVIDER, SECRET, Clock, body_of, effects, make_receiver, signed

COPIES = 100


async def test_without_pooler_transaction_the_store_fails_naming_the_fix(
    pgbouncers: dict[str, PgBouncer], pooled_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a new user met: `receiver serve` exited with DuplicatePreparedStatementError. Now
    the start-up check or the deliveries fail with StoreMisconfigured (503 to the sender) and
    an ALERT line that names the fix."""
    url = pgbouncers["transaction"].url(POOLED_DATABASE)
    rx, _ = make_receiver(PostgresStore(url, max_size=20))
    statuses: list[int | str] = []

    async def one(n: int) -> None:
        body = body_of(order=n)
        try:
            reply = await rx.deliver(PROVIDER, signed(f"probe-{n}", body), body)
        except StoreMisconfigured as exc:
            statuses.append(str(exc))
        else:
            statuses.append(reply.status_code)

    try:
        async with rx:
            for _ in range(3):  # concurrent transactions land on each other's server sessions
                await asyncio.gather(*(one(n) for n in range(60)))
    except StoreMisconfigured as exc:  # the start-up check met it first
        statuses.append(str(exc))
    refused = [s for s in statuses if s != 200]
    assert refused, "a transaction-mode pooler went unnoticed"
    # 503 (the store's failure, with an ALERT naming the fix), or 409 for a copy whose first
    # attempt is still being given back; never a 500.
    assert 503 in refused or any("?pooler" in str(s) for s in refused), set(map(str, refused))
    assert all(s in (409, 503) or "?pooler=transaction" in str(s) for s in refused), refused
    assert "?pooler=transaction" in caplog.text + " ".join(map(str, statuses))


async def test_the_race_runs_one_handler_through_the_pooler(
    pooled_url: str, pooled_database: str
) -> None:
    await truncate(pooled_database)
    rx, recorder = make_receiver(PostgresStore(pooled_url, max_size=20))
    body = body_of(order="o-1")
    headers = signed("msg_race", body)
    barrier = asyncio.Barrier(COPIES)
    async with rx:
        transport = httpx.ASGITransport(app=rx)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def copy() -> httpx.Response:
                await barrier.wait()  # every copy starts together
                return await client.post(f"/{PROVIDER}", content=body, headers=headers)

            answers = await asyncio.gather(*(copy() for _ in range(COPIES)))
            fresh = [
                await client.post(
                    f"/{PROVIDER}",
                    content=body_of(order=n),
                    headers=signed(f"m-{n}", body_of(order=n)),
                )
                for n in range(20)
            ]
        assert await effects(rx.store, "msg_race") == 1
        assert await effects(rx.store) == 21
    statuses = {a.status_code for a in answers}
    assert statuses <= {200, 409}, statuses
    assert (
        sum(a.status_code == 200 and "idempotent-replayed" not in a.headers for a in answers) == 1
    )
    assert all(f.status_code == 200 for f in fresh)
    assert recorder.calls["msg_race"] == 1 if hasattr(recorder, "calls") else True


async def test_the_executor_and_the_middleware_keep_one_effect_per_key(
    pooled_url: str, pooled_database: str
) -> None:
    await truncate(pooled_database)
    store = PostgresStore(pooled_url, max_size=20)
    async with store:
        actions = Actions(store, registry=CollectorRegistry(), sweep_interval=None)
        runs: list[int] = []

        @actions.tool("refund")
        async def refund(call: ToolCall, tx: Connection) -> Any:
            runs.append(call.fence)
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
                "refund",
                call.action.key,
                call.fence,
            )
            return {"refunded": True}

        action = actions.propose("refund", scope="t", action_id="o-1", request={"n": 1})
        barrier = asyncio.Barrier(50)

        async def execute() -> bytes:
            await barrier.wait()
            try:
                return (await actions.execute(action)).body
            except Exception as exc:  # ActionInProgress: the first attempt still runs
                return type(exc).__name__.encode()

        results = await asyncio.gather(*(execute() for _ in range(50)))
        assert runs == [1]
        assert set(results) <= {b'{"refunded":true}', b"ActionInProgress"}

        paid: list[int] = []

        async def pay(request: Request) -> Response:
            paid.append(1)
            return JSONResponse({"paid": len(paid)}, 201)

        app = Starlette(
            routes=[Route("/pay", pay, methods=["POST"])],
            middleware=[
                Middleware(
                    IdempotencyKeyMiddleware, store=store, principal=lambda s: "t",
                    sweep_interval=None, wait=5.0,
                )
            ],
        )  # fmt: skip
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answers = await asyncio.gather(
                *(
                    client.post("/pay", json={"a": 1}, headers={"idempotency-key": '"k"'})
                    for _ in range(30)
                )
            )
        assert paid == [1]
        assert {a.status_code for a in answers} <= {201, 409}


async def test_migrations_need_a_session(
    pgbouncers: dict[str, PgBouncer], pooled_database: str
) -> None:
    url = pgbouncers["transaction"].url(POOLED_DATABASE) + "?pooler=transaction"
    async with PostgresStore(url) as store:
        with pytest.raises(ConfigurationError, match="session of their own"):
            await store.migrate()
    import urllib.parse

    direct = urllib.parse.quote(pooled_database, safe="")
    async with PostgresStore(f"{url}&listen_url={direct}") as store:
        assert await store.migrate() == []  # current already: applied on the direct session


async def test_queued_workers_drain_exactly_once_through_the_pooler(
    pooled_url: str, pooled_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    await truncate(pooled_database)
    rx = Receiver(
        PostgresStore(pooled_url, max_size=10), [Provider(PROVIDER, [SECRET], mode="queued")]
    )
    ran: list[str] = []

    @rx.on("order.*")
    async def record(event: Event, tx: Connection) -> None:
        ran.append(event.id)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )

    async with rx:
        for n in range(40):
            body = body_of(order=n)
            assert (await rx.deliver(PROVIDER, signed(f"q-{n}", body), body)).status_code == 202
        workers = [rx.worker(concurrency=4, poll_interval=0.05) for _ in range(2)]
        with caplog.at_level(logging.INFO, logger="receiver"):
            tasks = [asyncio.create_task(w.run()) for w in workers]
            for _ in range(300):
                if len(ran) >= 40:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            for w in workers:
                w.stop()
            await asyncio.gather(*tasks)
        assert sorted(ran) == sorted(f"q-{n}" for n in range(40))
        assert await effects(rx.store) == 40
    said = " ".join(r.getMessage() for r in caplog.records)
    if "pooler=transaction" in pooled_url:
        assert "no LISTEN" in said  # a transaction-mode pooler without listen_url: polling
    else:
        assert "LISTEN on the store URL" in said


@pytest.fixture
def partitioned_pooled(pg_admin_url: str, pgbouncers: dict[str, PgBouncer]) -> Iterator[str]:
    """A database of its own in the partitioned layout (dropped with FORCE: the poolers keep
    server sessions to it)."""
    name = f"receiver_test_pooled_partitioned_{os.getpid()}"
    yield asyncio.run(prepared_database(pg_admin_url, name, "partitioned"))
    asyncio.run(pgcluster.drop_database(pg_admin_url, name))


@pytest.mark.parametrize("mode", ["transaction", "session"])
async def test_the_partitioned_layout_through_the_pooler(
    pgbouncers: dict[str, PgBouncer], partitioned_pooled: str, mode: str
) -> None:
    """The partitioned layout's trigger, its sweep's advisory locks and transaction-local
    settings, and its partition DDL, through a real PgBouncer: the race still runs one
    handler, a day's partition is opened and the old one dropped, and a redelivery after the
    drop is a new delivery while one within its window replays."""
    name = partitioned_pooled.rsplit("/", 1)[1]
    url = pgbouncers[mode].url(name) + f"?pooler={mode}"
    clock = Clock()
    rx, recorder = make_receiver(PostgresStore(url, max_size=20), clock=clock)
    body = body_of(order="o-1")
    barrier = asyncio.Barrier(COPIES)
    async with rx:
        transport = httpx.ASGITransport(app=rx)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def send(webhook_id: str, payload: bytes) -> httpx.Response:
                headers = signed(webhook_id, payload, timestamp=clock.now)
                return await client.post(f"/{PROVIDER}", content=payload, headers=headers)

            async def copy() -> httpx.Response:
                await barrier.wait()
                return await send("msg_race", body)

            answers = await asyncio.gather(*(copy() for _ in range(COPIES)))
            assert {a.status_code for a in answers} <= {200, 409}
            assert recorder.calls["msg_race"] == 1
            # A day later the sweep opens the next partition; once the first day's window is
            # over, it drops the first partition, through the pooler.
            clock.advance(partitions.SPAN + 1)
            await rx.sweep()
            fresh = await send("msg_fresh", body_of(order="o-2"))
            assert fresh.status_code == 200
            clock.advance(40 * partitions.SPAN)
            await rx.sweep()
            async with rx.store.acquire() as conn:
                kept = await conn.fetch("SELECT bucket FROM receiver_partitions ORDER BY bucket")
            assert kept[0]["bucket"] > 1, kept  # the race's partition is gone
            again = await send("msg_race", body)
            assert again.status_code == 200
            assert "idempotent-replayed" not in again.headers  # expired: a new delivery
            assert recorder.calls["msg_race"] == 2
