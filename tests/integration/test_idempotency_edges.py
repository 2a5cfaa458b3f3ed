"""The Idempotency-Key middleware at its edges (issue 19, items 4, 6 and 11), on both stores:
a cancelled request gives its key back at once, a failed request's stored error carries no
payload value, and two amounts a double cannot tell apart are two requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from receiver import IdempotencyKeyMiddleware, PostgresStore, Store, idempotent_request
from receiver._ledger.receipts import State
from tests import pgcluster

SECRET_EMAIL = "alice@example.com"


class Endpoints:
    def __init__(self) -> None:
        self.runs = 0
        self.hang = True
        self.started = asyncio.Event()

    async def pay(self, request: Request) -> Response:
        self.runs += 1
        body = await request.json()
        if self.hang:
            self.hang = False
            self.started.set()
            await asyncio.sleep(60)  # the client gives up long before
        return JSONResponse({"amount": body["amount"], "run": self.runs}, 201)

    async def signup(self, request: Request) -> Response:
        keyed = idempotent_request(request)
        assert keyed is not None
        body = await request.json()
        await keyed.tx.execute("CREATE TABLE IF NOT EXISTS people (email TEXT PRIMARY KEY)")
        for _ in range(2):
            await keyed.tx.execute("INSERT INTO people (email) VALUES ($1)", body["email"])
        return JSONResponse({})


def app(store: Store, endpoints: Endpoints) -> Starlette:
    return Starlette(
        routes=[
            Route("/pay", endpoints.pay, methods=["POST"]),
            Route("/signup", endpoints.signup, methods=["POST"]),
        ],
        middleware=[
            Middleware(IdempotencyKeyMiddleware, store=store, principal=lambda s: "t", lease=60.0)
        ],
    )


async def rows(store: Store) -> list[tuple[str, str | None]]:
    async with store.acquire() as conn:
        found = await conn.fetch(
            "SELECT state, last_error FROM receiver_receipts WHERE provider LIKE 'idem:%'"
        )
    return [(r["state"], r["last_error"]) for r in found]


async def call(asgi: Any, path: str, body: dict[str, Any], key: str) -> Message:
    """One request straight through the ASGI app; the start message of its answer."""
    return (await exchange(asgi, path, body, key))[0]


async def exchange(
    asgi: Any, path: str, body: dict[str, Any], key: str, extensions: dict[str, Any] | None = None
) -> list[Message]:
    """One request straight through the ASGI app (from a server offering ``extensions``); every
    message of its answer."""
    raw = orjson.dumps(body)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"idempotency-key", key.encode())],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
        "extensions": extensions or {},
    }
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)

    await asyncio.wait_for(asgi(scope, receive, send), 10)
    return sent


async def test_a_cancelled_request_gives_its_key_back_at_once(store: Store) -> None:
    endpoints = Endpoints()
    asgi = app(store, endpoints)
    async with asgi.router.lifespan_context(asgi):
        first = asyncio.create_task(call(asgi, "/pay", {"amount": 5}, '"k-1"'))
        await endpoints.started.wait()
        first.cancel()  # the server cancels the request: the client hung up
        await asyncio.gather(first, return_exceptions=True)
        assert [state for state, _ in await rows(store)] == [State.RELEASED.value]
        # The retry runs now: no "in progress" until the 60 s lease runs out.
        answer = await call(asgi, "/pay", {"amount": 5}, '"k-1"')
    assert answer["status"] == 201
    assert endpoints.runs == 2


async def test_a_failed_requests_stored_error_carries_no_payload_value(store: Store) -> None:
    transport = httpx.ASGITransport(app=app(store, Endpoints()), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post(
            "/signup", json={"email": SECRET_EMAIL}, headers={"idempotency-key": '"k-2"'}
        )
    assert answer.status_code == 500
    ((state, error),) = await rows(store)
    assert state == State.RELEASED.value
    assert error is not None
    assert SECRET_EMAIL not in error


async def test_amounts_a_double_cannot_tell_apart_are_two_requests(store: Store) -> None:
    endpoints = Endpoints()
    endpoints.hang = False
    transport = httpx.ASGITransport(app=app(store, endpoints))
    headers = {"idempotency-key": '"k-3"', "content-type": "application/json"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = await client.post(
            "/pay", content=b'{"amount":10000000000000001.0}', headers=headers
        )
        second = await client.post(
            "/pay", content=b'{"amount":10000000000000000.0}', headers=headers
        )
        again = await client.post(
            "/pay", content=b'{"amount": 10000000000000001.00}', headers=headers
        )
    assert first.status_code == 201
    assert second.status_code == 422  # never the first answer under "Idempotent-Replayed"
    assert again.headers.get("idempotent-replayed") == "true"
    assert endpoints.runs == 1


def test_a_required_path_outside_paths_is_refused_at_start_up(sqlite_store: Store) -> None:
    """Issue 19 item 13: the middleware never sees a path outside ``paths=``, so requiring a
    key there cannot mean what it says."""
    from receiver import ConfigurationError

    def build(paths: list[str] | None, required: list[str]) -> IdempotencyKeyMiddleware:
        return IdempotencyKeyMiddleware(
            Starlette(), store=sqlite_store, principal=lambda s: "t", paths=paths,
            required=required,
        )  # fmt: skip

    with pytest.raises(ConfigurationError, match="/refunds"):
        build(["/payments"], ["/payments", "/refunds"])
    with pytest.raises(ConfigurationError, match=r"/admin/\*"):
        build(["/api/*"], ["/admin/*"])
    build(["/api/*"], ["/api/payments", "/api/refunds/*"])  # covered
    build(None, ["/anything"])  # every path is seen


async def test_retry_after_is_when_the_first_request_likely_ends(store: Store) -> None:
    """Issue 19 item 10: not the remaining 60 s lease for a request that takes a moment."""
    gate = asyncio.Event()
    gate.set()
    started = asyncio.Event()

    async def quick(request: Request) -> Response:
        started.set()
        await gate.wait()
        return JSONResponse({}, 201)

    asgi = Starlette(
        routes=[Route("/quick", quick, methods=["POST"])],
        middleware=[
            Middleware(IdempotencyKeyMiddleware, store=store, principal=lambda s: "t", lease=60.0)
        ],
    )
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/quick", json={}, headers={"idempotency-key": '"a"'})).is_success
        gate.clear()
        started.clear()
        first = asyncio.create_task(
            client.post("/quick", json={}, headers={"idempotency-key": '"b"'})
        )
        await started.wait()
        duplicate = await client.post("/quick", json={}, headers={"idempotency-key": '"b"'})
        gate.set()
        await first
    assert duplicate.status_code == 409
    assert duplicate.headers["retry-after"] == "1"


async def test_an_unreachable_store_is_answered_503_with_retry_after() -> None:
    """The database down (or failing over): a keyed request is refused with a problem+json 503
    and Retry-After, which clients retry with the same key; never a 500, and the endpoint does
    not run."""
    endpoints = Endpoints()
    endpoints.hang = False
    nobody = pgcluster.free_port()  # nothing listens there
    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{nobody}/db", connect_timeout=1)
    transport = httpx.ASGITransport(app=app(store, endpoints))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        answer = await client.post("/pay", json={"amount": 1}, headers={"idempotency-key": "k"})
    await store.close()
    assert answer.status_code == 503, answer.content
    assert answer.headers["content-type"] == "application/problem+json"
    assert int(answer.headers["retry-after"]) >= 1
    assert orjson.loads(answer.content)["type"] == "urn:receiver:idempotency:store-unavailable"
    assert endpoints.runs == 0


# A server that sends files by path (Granian) and offers trailers: Starlette's FileResponse then
# answers with http.response.pathsend, no body; an endpoint may promise trailers.
SERVER_EXTENSIONS = {"http.response.pathsend": {}, "http.response.trailers": {}}


async def test_a_file_answer_is_stored_and_replayed_whole(store: Store, tmp_path: Path) -> None:
    (tmp_path / "receipt.txt").write_bytes(b"receipt 42")
    told: list[set[str]] = []

    async def receipt(request: Request) -> Response:
        told.append(set(request.scope["extensions"]))
        return FileResponse(tmp_path / "receipt.txt")

    asgi = Starlette(
        routes=[Route("/receipt", receipt, methods=["POST"])],
        middleware=[Middleware(IdempotencyKeyMiddleware, store=store, principal=lambda s: "t")],
    )
    first = await exchange(asgi, "/receipt", {}, '"k-4"', SERVER_EXTENSIONS)
    again = await exchange(asgi, "/receipt", {}, '"k-4"', SERVER_EXTENSIONS)
    assert [m["type"] for m in first] == ["http.response.start", "http.response.body"]
    assert "trailers" not in first[0]
    assert first[1]["body"] == again[1]["body"] == b"receipt 42"
    assert dict(again[0]["headers"])[b"idempotent-replayed"] == b"true"
    assert told == [set()]  # nothing the stored answer could not hold
