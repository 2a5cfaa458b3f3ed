"""Micro-batched claims and completions on PostgreSQL (issue 15, item 1): one statement decides
many claims, the primary key still arbitrates every one of them, duplicates inside one batch are
duplicates like any other, and one item's problem never fails its neighbours."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from receiver import (
    Connection,
    Event,
    IdempotencyKeyMiddleware,
    PostgresStore,
    Provider,
    Receiver,
)
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key, State, StoredResponse
from receiver._verification.payload import parse
from tests.conftest import truncate
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, effects, signed


def claim_of(webhook_id: str, body: bytes | None = None) -> Claim:
    body = body_of(order=webhook_id) if body is None else body
    return Claim(
        Key(PROVIDER, webhook_id), parse(body, None).payload_hash, "x", body, None, 60, 3600
    )


async def test_one_statement_claims_many_and_the_key_still_arbitrates(
    pg_store: PostgresStore,
) -> None:
    async with pg_store.acquire() as conn:
        first = await ledger.claim(conn, claim_of("old"))
        assert isinstance(first, ledger.Claimed)
        batch = [claim_of("a"), claim_of("b"), claim_of("a"), claim_of("old"), claim_of("c")]
        results = await ledger.claim_many(conn, batch, None)
    a1, b, a2, old, c = results
    assert isinstance(a1, ledger.Claimed)
    assert a1.fence == 1
    assert isinstance(b, ledger.Claimed)
    assert isinstance(c, ledger.Claimed)
    assert a2 is None  # the same key, later in the same batch: the caller looks it up
    assert isinstance(old, ledger.Receipt)
    assert old.state is State.IN_FLIGHT
    assert a1.now == b.now == c.now


async def test_one_statement_completes_many_and_refuses_stale_fences(
    pg_store: PostgresStore,
) -> None:
    answer = StoredResponse(200, "application/json", b"{}", (("x-a", "1"),))
    async with pg_store.acquire() as conn:
        for name in ("a", "b"):
            assert isinstance(await ledger.claim(conn, claim_of(name)), ledger.Claimed)
        done = await ledger.complete_many(
            conn,
            [
                ledger.Completion(Key(PROVIDER, "a"), 1, answer),
                ledger.Completion(Key(PROVIDER, "b"), 7, answer),  # stale fence
            ],
            None,
        )
        assert done == [True, False]
        a = await ledger.lookup(conn, Key(PROVIDER, "a"))
        b = await ledger.lookup(conn, Key(PROVIDER, "b"))
    assert a is not None
    assert a.state is State.COMPLETED
    assert a.response == answer
    assert a.request_body is None
    assert b is not None
    assert b.state is State.IN_FLIGHT


async def test_concurrent_deliveries_share_statements_and_each_runs_once(pg_url: str) -> None:
    await truncate(pg_url)
    async with PostgresStore(pg_url, max_size=4) as store:
        rx = Receiver(store, [Provider(PROVIDER, [SECRET])], replay_cache=0)
        runs: dict[str, int] = {}

        @rx.on_startup
        async def create_effects(conn: Connection) -> None:
            await conn.execute(EFFECTS_DDL)

        @rx.on("order.created")
        async def noop(event: Event, tx: Connection) -> dict[str, str]:
            runs[event.id] = runs.get(event.id, 0) + 1
            return {"id": event.id}

        @rx.on("order.paid")
        async def write(event: Event, tx: Connection) -> None:
            runs[event.id] = runs.get(event.id, 0) + 1
            await tx.execute(
                "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
                event.provider,
                event.id,
                event.fence,
            )

        await rx.open()
        try:
            deliveries = []
            for i in range(60):
                kind = "order.created" if i % 2 else "order.paid"
                body = body_of(kind, n=i)
                deliveries += [(f"msg_{i}", body)] * 3  # every delivery three times
            barrier = asyncio.Barrier(len(deliveries))
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=rx), base_url="http://test"
            ) as client:

                async def send(webhook_id: str, body: bytes) -> int:
                    await barrier.wait()
                    response = await client.post(
                        f"/{PROVIDER}", content=body, headers=signed(webhook_id, body)
                    )
                    return response.status_code

                statuses = await asyncio.gather(*(send(w, b) for w, b in deliveries))
        finally:
            await rx.close()
        assert set(statuses) <= {200, 409}
        assert all(n == 1 for n in runs.values())
        assert len(runs) == 60
        assert await effects(store) == 30
        claims = rx.pipeline.shared.claims
        assert claims is not None
        assert max(claims.sizes) > 1  # claims did share statements
        assert len(claims.sizes) < len(deliveries) / 10  # far fewer statements than claims


async def test_one_bad_claim_does_not_fail_its_neighbours(pg_store: PostgresStore) -> None:
    rx = Receiver(pg_store, [Provider(PROVIDER, [SECRET])])
    good = [claim_of(f"good_{i}") for i in range(5)]
    # An event type PostgreSQL cannot store (NUL): the batch statement fails, then each claim
    # is tried alone, and only the bad one fails.
    bad = Claim(Key(PROVIDER, "bad"), b"h" * 32, "x\x00y", b"{}", None, 60, 3600)
    results = await rx.pipeline.shared.flush_claims([*good[:2], bad, *good[2:]])
    assert isinstance(results[2], Exception)
    assert all(isinstance(r, ledger.Claimed) for i, r in enumerate(results) if i != 2)


async def test_concurrent_keyed_requests_share_statements_and_each_runs_once(pg_url: str) -> None:
    """The Idempotency-Key middleware claims and completes fresh keys through the same shared
    statements as deliveries (over HTTP at 64 connections: 0.7x the hand-written middleware
    one statement each, 1.1-1.6x batched; docs/performance/index.md)."""
    await truncate(pg_url)
    runs: dict[str, int] = {}

    async def create(request: Request) -> JSONResponse:
        key = request.headers["idempotency-key"]
        runs[key] = runs.get(key, 0) + 1
        return JSONResponse({"order": key}, status_code=201)

    async with PostgresStore(pg_url, max_size=4) as store:
        app = IdempotencyKeyMiddleware(
            Starlette(routes=[Route("/orders", create, methods=["POST"])]),
            store=store,
            principal=lambda scope: "t-1",
            replay_cache=0,
        )
        requests = [f'"k-{i}"' for i in range(60)] * 3  # every key three times
        barrier = asyncio.Barrier(len(requests))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as client:

            async def send(key: str) -> int:
                await barrier.wait()
                response = await client.post(
                    "/orders", json={"amount": 1200}, headers={"idempotency-key": key}
                )
                return response.status_code

            statuses = await asyncio.gather(*(send(k) for k in requests))
        assert set(statuses) <= {201, 409}
        assert statuses.count(201) >= 60
        assert all(n == 1 for n in runs.values())
        assert len(runs) == 60
        claims, completions = app._shared.claims, app._shared.completions
        assert claims is not None
        assert completions is not None
        assert max(claims.sizes) > 1  # claims did share statements
        assert max(completions.sizes) > 1
        assert len(claims.sizes) < len(requests) / 5
