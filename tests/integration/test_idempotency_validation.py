"""A request the framework refuses before the endpoint runs (FastAPI's 422 for a body that
fails its model) is not stored under its Idempotency-Key: the client corrects the body and
sends it again under the same key, and the endpoint runs once, for the corrected request. On
PostgreSQL and SQLite, through FastAPI's real request validation."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel, Field
from starlette.middleware import Middleware
from starlette.responses import JSONResponse

from receiver import IdempotencyKeyMiddleware, Store, idempotent_request
from tests.support import EFFECTS_DDL


class Payment(BaseModel):
    amount: int = Field(gt=0)


def shop(store: Store, runs: collections.Counter[str], **options: Any) -> FastAPI:
    middleware = Middleware(
        IdempotencyKeyMiddleware, store=store, principal=lambda scope: "t-1", **options
    )
    app = FastAPI(middleware=[middleware])

    @app.post("/payments", status_code=201)
    async def pay(payment: Payment, request: Request) -> dict[str, int]:
        runs["payments"] += 1
        keyed = idempotent_request(request)
        assert keyed is not None
        await keyed.tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            keyed.principal,
            keyed.key,
            keyed.fence,
            str(payment.amount),
        )
        return {"amount": payment.amount}

    @app.post("/refunds")
    async def refund(request: Request) -> JSONResponse:
        # The endpoint's own 422, after a write through the ledger's transaction.
        runs["refunds"] += 1
        keyed = idempotent_request(request)
        assert keyed is not None
        await keyed.tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            keyed.principal,
            keyed.key,
            keyed.fence,
            "refund",
        )
        return JSONResponse({"error": "already refunded"}, 422)

    return app


@pytest.fixture
async def runs(store: Store) -> collections.Counter[str]:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    return collections.Counter()


async def client_of(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


async def effects(store: Store) -> list[str]:
    async with store.acquire() as conn:
        rows = await conn.fetch("SELECT note FROM effects ORDER BY note")
    return [row["note"] for row in rows]


KEY = {"idempotency-key": '"k-1"', "content-type": "application/json"}


async def test_a_request_that_fails_validation_may_be_corrected_under_its_key(
    store: Store, runs: collections.Counter[str]
) -> None:
    async for client in client_of(shop(store, runs)):
        refused = await client.post("/payments", content=b'{"amount": -5}', headers=KEY)
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["loc"] == ["body", "amount"]
        assert "idempotent-replayed" not in refused.headers
        corrected = await client.post("/payments", content=b'{"amount": 5}', headers=KEY)
        assert corrected.status_code == 201, corrected.text
        again = await client.post("/payments", content=b'{"amount": 5}', headers=KEY)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == corrected.content
    assert runs["payments"] == 1
    assert await effects(store) == ["5"]


async def test_every_4xx_is_stored_when_asked(store: Store, runs: collections.Counter[str]) -> None:
    async for client in client_of(shop(store, runs, unstored_statuses=())):
        first = await client.post("/payments", content=b'{"amount": -5}', headers=KEY)
        assert first.status_code == 422
        again = await client.post("/payments", content=b'{"amount": -5}', headers=KEY)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
        corrected = await client.post("/payments", content=b'{"amount": 5}', headers=KEY)
        # The key is the first request's: another body under it is the mismatch.
        assert corrected.status_code == 422
        assert corrected.headers["content-type"] == "application/problem+json"
    assert runs["payments"] == 0
    assert await effects(store) == []


async def test_an_unstored_answer_rolls_the_endpoints_writes_back(
    store: Store, runs: collections.Counter[str]
) -> None:
    async for client in client_of(shop(store, runs)):
        for _ in range(2):
            answer = await client.post("/refunds", content=b"{}", headers=KEY)
            assert answer.status_code == 422
            assert answer.json() == {"error": "already refunded"}
            assert "idempotent-replayed" not in answer.headers
    # Each attempt ran and rolled back: nothing of a 422 that is not stored commits.
    assert runs["refunds"] == 2
    assert await effects(store) == []
