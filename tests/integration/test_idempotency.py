"""The Idempotency-Key middleware (draft-ietf-httpapi-idempotency-key-header) on the real
ledger, through a plain Starlette app and through FastAPI, on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Scope

from receiver import IdempotencyKeyMiddleware, Receiver, Store, idempotent_request
from tests.support import EFFECTS_DDL, Clock, SimulatedCrash, ledger_clock


class Shop:
    """The endpoints' real work: ``/payments`` writes a business row through the ledger's
    transaction and answers 201 with a Location; ``/flaky`` answers 503 once; ``/slow`` waits
    for a gate."""

    def __init__(self) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.flaky_left = 1
        self.crash = False

    async def payments(self, request: Request) -> Response:
        self.runs["payments"] += 1
        self.started.set()
        await self.gate.wait()
        body = await request.json()
        keyed = idempotent_request(request)
        assert keyed is not None
        await keyed.tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            keyed.principal,
            keyed.key,
            keyed.fence,
            str(body.get("amount")),
        )
        if self.crash:
            self.crash = False
            raise SimulatedCrash("payments")
        if body.get("amount", 0) < 0:
            return JSONResponse({"error": "negative"}, 400)
        answer = {"payment": f"pay_{self.runs['payments']}", "amount": body.get("amount")}
        return JSONResponse(
            answer, 201, headers={"location": f"/payments/pay_{self.runs['payments']}"}
        )

    async def flaky(self, request: Request) -> Response:
        self.runs["flaky"] += 1
        if self.flaky_left:
            self.flaky_left -= 1
            return JSONResponse({"error": "try later"}, 503)
        return JSONResponse({"ok": True})

    async def broken(self, request: Request) -> Response:
        self.runs["broken"] += 1
        raise RuntimeError("the endpoint has a bug")

    async def stream(self, request: Request) -> Response:
        self.runs["stream"] += 1

        async def chunks() -> AsyncIterator[bytes]:
            for n in range(20):
                await asyncio.sleep(0)
                yield b"chunk %d;" % n

        return StreamingResponse(chunks(), media_type="text/plain")

    async def note(self, request: Request) -> Response:
        self.runs["note"] += 1
        return Response(b"noted", 200, media_type="text/plain")


def tenant(scope: Scope) -> str:
    return Headers(scope=scope).get("x-tenant", "anonymous")


def build(kind: str, store: Store, shop: Shop, **options: Any) -> Any:
    middleware = Middleware(
        IdempotencyKeyMiddleware,
        store=store,
        principal=tenant,
        required=["/payments", "/flaky", "/broken"],
        **options,
    )
    if kind == "starlette":
        return Starlette(
            routes=[
                Route("/payments", shop.payments, methods=["POST", "GET"]),
                Route("/flaky", shop.flaky, methods=["POST"]),
                Route("/broken", shop.broken, methods=["POST"]),
                Route("/notes/{id}", shop.note, methods=["PATCH", "POST"]),
                Route("/stream", shop.stream, methods=["POST"]),
            ],
            middleware=[middleware],
        )
    app = FastAPI(middleware=[middleware])
    app.add_api_route("/payments", shop.payments, methods=["POST", "GET"])
    app.add_api_route("/flaky", shop.flaky, methods=["POST"])
    app.add_api_route("/broken", shop.broken, methods=["POST"])
    app.add_api_route("/notes/{id}", shop.note, methods=["PATCH", "POST"])
    app.add_api_route("/stream", shop.stream, methods=["POST"])
    return app


@pytest.fixture(params=["starlette", "fastapi"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def shop(store: Store) -> Shop:
    async with store.acquire() as conn:
        await conn.execute(EFFECTS_DDL)
    return Shop()


@pytest.fixture
async def client(kind: str, store: Store, shop: Shop) -> AsyncIterator[httpx.AsyncClient]:
    app = build(kind, store, shop)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


def headers(key: str | None = '"k-1"', tenant: str = "t-1") -> dict[str, str]:
    found = {"x-tenant": tenant, "content-type": "application/json"}
    if key is not None:
        found["idempotency-key"] = key
    return found


async def keys_stored(store: Store) -> int:
    async with store.acquire() as conn:
        n = await conn.fetchval(
            "SELECT count(*) FROM receiver_receipts WHERE provider LIKE 'idem:%'"
        )
    return int(n)


async def committed(store: Store) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM effects"))


def is_problem(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status
    assert problem["title"]
    assert problem["detail"]


async def test_replay_is_byte_identical(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    first = await client.post("/payments", content=b'{"amount": 5}', headers=headers())
    again = await client.post("/payments", content=b'{"amount":5}', headers=headers())
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers["content-type"] == first.headers["content-type"]
    assert again.headers["location"] == first.headers["location"]
    assert shop.runs["payments"] == 1
    assert await committed(store) == 1


async def test_a_bare_token_is_the_same_key_as_the_quoted_string(
    client: httpx.AsyncClient, shop: Shop
) -> None:
    await client.post("/payments", content=b'{"amount": 5}', headers=headers('"k-9"'))
    again = await client.post("/payments", content=b'{"amount": 5}', headers=headers("k-9"))
    assert again.headers["idempotent-replayed"] == "true"
    assert shop.runs["payments"] == 1


async def test_a_4xx_answer_is_stored_too(client: httpx.AsyncClient, shop: Shop) -> None:
    first = await client.post("/payments", content=b'{"amount": -1}', headers=headers())
    again = await client.post("/payments", content=b'{"amount": -1}', headers=headers())
    assert first.status_code == again.status_code == 400
    assert again.headers["idempotent-replayed"] == "true"
    assert shop.runs["payments"] == 1


async def test_missing_required_key_is_400(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    response = await client.post("/payments", content=b'{"amount": 5}', headers=headers(None))
    is_problem(response, 400)
    assert shop.runs["payments"] == 0
    assert await keys_stored(store) == 0


async def test_optional_routes_and_other_methods_pass_through(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    for _ in range(2):
        assert (await client.patch("/notes/1", headers=headers(None))).status_code == 200
    assert shop.runs["note"] == 2
    assert await keys_stored(store) == 0
    first = await client.patch("/notes/1", headers=headers('"n-1"'))
    again = await client.patch("/notes/1", headers=headers('"n-1"'))
    assert again.headers["idempotent-replayed"] == "true"
    assert (again.content, again.headers["content-type"]) == (b"noted", "text/plain; charset=utf-8")
    assert first.content == again.content
    assert shop.runs["note"] == 3


async def test_reused_key_with_another_request_is_422(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    await client.post("/payments", content=b'{"amount": 5}', headers=headers())
    is_problem(await client.post("/payments", content=b'{"amount": 6}', headers=headers()), 422)
    is_problem(await client.post("/notes/1", content=b'{"amount": 5}', headers=headers()), 422)
    is_problem(await client.post("/payments?x=1", content=b'{"amount": 5}', headers=headers()), 422)
    assert shop.runs["payments"] == 1
    assert await committed(store) == 1


async def test_in_flight_is_409_with_retry_after(client: httpx.AsyncClient, shop: Shop) -> None:
    shop.gate.clear()
    first = asyncio.create_task(
        client.post("/payments", content=b'{"amount": 5}', headers=headers())
    )
    await shop.started.wait()
    second = await client.post("/payments", content=b'{"amount": 5}', headers=headers())
    is_problem(second, 409)
    assert int(second.headers["retry-after"]) >= 1
    shop.gate.set()
    assert (await first).status_code == 201
    assert shop.runs["payments"] == 1


async def test_a_5xx_is_never_stored(client: httpx.AsyncClient, shop: Shop) -> None:
    first = await client.post("/flaky", content=b"{}", headers=headers())
    again = await client.post("/flaky", content=b"{}", headers=headers())
    assert first.status_code == 503
    assert again.status_code == 200
    assert "idempotent-replayed" not in again.headers
    assert shop.runs["flaky"] == 2


async def test_an_endpoint_that_raises_gives_the_key_back(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    for _ in range(2):
        assert (await client.post("/broken", content=b"{}", headers=headers())).status_code == 500
    assert shop.runs["broken"] == 2
    async with store.acquire() as conn:
        state = await conn.fetchval("SELECT state FROM receiver_receipts")
    assert state == "released"


async def test_two_tenants_with_one_key_do_not_collide(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    a = await client.post("/payments", content=b'{"amount": 5}', headers=headers(tenant="a"))
    b = await client.post("/payments", content=b'{"amount": 7}', headers=headers(tenant="b"))
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["amount"] == 5
    assert b.json()["amount"] == 7
    assert shop.runs["payments"] == 2
    assert await keys_stored(store) == 2


async def test_a_body_over_the_limit_is_413(kind: str, store: Store, shop: Shop) -> None:
    app = build(kind, store, shop, max_body_size=10)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        response = await c.post("/payments", content=b'{"amount": 123456}', headers=headers())
    is_problem(response, 413)
    assert await keys_stored(store) == 0


async def test_100_concurrent_requests_run_the_endpoint_once(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    barrier = asyncio.Barrier(100)

    async def one() -> httpx.Response:
        await barrier.wait()
        return await client.post("/payments", content=b'{"amount": 5}', headers=headers())

    answers = await asyncio.gather(*(one() for _ in range(100)))
    fresh = [a for a in answers if a.status_code == 201 and "idempotent-replayed" not in a.headers]
    replayed = [a for a in answers if a.headers.get("idempotent-replayed") == "true"]
    busy = [a for a in answers if a.status_code == 409]
    assert len(fresh) == 1
    assert len(fresh) + len(replayed) + len(busy) == 100
    assert all(r.content == fresh[0].content for r in replayed)
    assert shop.runs["payments"] == 1
    assert await committed(store) == 1


async def test_the_endpoints_writes_commit_with_the_answer_after_a_crash(
    kind: str, store: Store, shop: Shop
) -> None:
    clock = Clock()
    ledger_clock(store, clock)
    app = build(kind, store, shop, lease=30.0)
    shop.crash = True
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        with pytest.raises(SimulatedCrash):
            await c.post("/payments", content=b'{"amount": 5}', headers=headers())
        assert await committed(store) == 0  # the write died with the ledger's transaction
        is_problem(await c.post("/payments", content=b'{"amount": 5}', headers=headers()), 409)
        clock.advance(31)  # the dead attempt's lease runs out: the retry runs it again
        assert (
            await c.post("/payments", content=b'{"amount": 5}', headers=headers())
        ).status_code == 201
    assert shop.runs["payments"] == 2
    assert await committed(store) == 1


BAD_KEYS = st.one_of(
    st.just(b""),
    st.just(b'""'),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=256)
    .map(lambda s: s.replace('"', "").replace("\\", "").encode())
    .filter(lambda b: len(b) > 255)
    .map(lambda b: b'"' + b + b'"'),
    st.text(min_size=1)
    .filter(lambda s: any(ord(c) > 126 for c in s))
    .map(lambda s: s.encode("utf-8")),
    st.text(alphabet=' ,;\\"()[]{}', min_size=1).map(lambda s: ("a" + s + "b").encode()),
    # Unquoted: a bare token past 255 characters, or half a quoted string.
    st.text(alphabet="abcdef0123456789-", min_size=256, max_size=400).map(str.encode),
    st.text(alphabet="abc", min_size=1).map(lambda s: ('"' + s).encode()),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=BAD_KEYS, duplicated=st.booleans())
async def test_bad_keys_get_a_clear_400_and_store_nothing(
    client: httpx.AsyncClient, store: Store, shop: Shop, value: bytes, duplicated: bool
) -> None:
    raw: list[tuple[bytes, bytes]] = [(b"x-tenant", b"t"), (b"idempotency-key", value)]
    if duplicated:
        raw.append((b"idempotency-key", b'"k-1"'))
    response = await client.post("/payments", content=b'{"amount": 5}', headers=raw)
    is_problem(response, 400)
    assert shop.runs["payments"] == 0
    assert await keys_stored(store) == 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.text(
        alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=255
    )
)
async def test_any_sf_string_key_is_accepted_and_replayed(
    client: httpx.AsyncClient, shop: Shop, key: str
) -> None:
    quoted = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    body = orjson.dumps({"amount": len(key)})
    first = await client.post("/payments", content=body, headers=headers(quoted, tenant=key))
    again = await client.post("/payments", content=body, headers=headers(quoted, tenant=key))
    assert first.status_code == 201, first.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content


async def test_two_key_fields_are_400_even_when_equal(
    client: httpx.AsyncClient, store: Store, shop: Shop
) -> None:
    raw = [(b"x-tenant", b"t"), (b"idempotency-key", b'"k-1"'), (b"idempotency-key", b'"k-1"')]
    is_problem(await client.post("/payments", content=b'{"amount": 5}', headers=raw), 400)
    combined = [(b"x-tenant", b"t"), (b"idempotency-key", b'"k-1", "k-2"')]
    is_problem(await client.post("/payments", content=b'{"amount": 5}', headers=combined), 400)
    assert shop.runs["payments"] == 0
    assert await keys_stored(store) == 0


async def test_another_process_replays_from_the_ledger(kind: str, store: Store, shop: Shop) -> None:
    """Two middleware instances (two processes' worth of replay cache) share one ledger."""
    answers = []
    for _ in range(2):
        app = build(kind, store, shop)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            answers.append(await c.post("/payments", content=b'{"amount": 5}', headers=headers()))
    first, again = answers
    assert again.headers["idempotent-replayed"] == "true"
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert shop.runs["payments"] == 1


async def test_the_sweeper_gives_back_a_key_whose_request_died(
    kind: str, store: Store, shop: Shop
) -> None:
    """A request killed mid-endpoint leaves its key in flight; after the lease the receiver's
    sweeper gives it back (never marks it failed), and the retry runs the endpoint."""
    clock = Clock()
    ledger_clock(store, clock)
    rx = Receiver(store, clock=clock, sweep_interval=None)
    app = build(kind, store, shop, lease=30.0)
    shop.crash = True
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        with pytest.raises(SimulatedCrash):
            await c.post("/payments", content=b'{"amount": 5}', headers=headers())
        clock.advance(31)
        report = await rx.sweep()
        assert (report.released, report.failed) == (1, 0)
        retry = await c.post("/payments", content=b'{"amount": 5}', headers=headers())
    assert retry.status_code == 201
    assert "idempotent-replayed" not in retry.headers
    assert await committed(store) == 1


async def test_a_streamed_answer_is_stored_whole(client: httpx.AsyncClient, shop: Shop) -> None:
    """The endpoint sees the client's own messages after the body (a streaming response listens
    for the disconnect), so its whole answer is stored and replayed."""
    whole = b"".join(b"chunk %d;" % n for n in range(20))
    first = await client.post("/stream", content=b"{}", headers=headers())
    again = await client.post("/stream", content=b"{}", headers=headers())
    assert first.content == whole
    assert again.content == whole
    assert again.headers["idempotent-replayed"] == "true"
    assert shop.runs["stream"] == 1
