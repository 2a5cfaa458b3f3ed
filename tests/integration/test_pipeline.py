"""The conformance suite: every answer of docs/reference/http.md, on both stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Mount

from receiver import (
    Connection,
    Event,
    PostgresStore,
    Provider,
    Receiver,
    ReceiverError,
    SQLiteStore,
    Store,
)
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from tests.pgcluster import free_port
from tests.support import (
    EFFECTS_DDL,
    PROVIDER,
    SECRET,
    T0,
    Clock,
    body_of,
    effects,
    ledger_clock,
    make_receiver,
    receipt_count,
    signed,
)


async def open_client(rx: Receiver) -> httpx.AsyncClient:
    await rx.open()
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://test")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def app(store: Store, clock: Clock) -> AsyncIterator[tuple[httpx.AsyncClient, Receiver]]:
    rx, _ = make_receiver(store, clock=clock)
    async with await open_client(rx) as client:
        yield client, rx


async def post(
    client: httpx.AsyncClient, webhook_id: str, body: bytes, clock: Clock, path: str = PROVIDER
) -> httpx.Response:
    headers = signed(webhook_id, body, timestamp=clock.now)
    return await client.post(f"/{path}", content=body, headers=headers)


async def row(store: Store, webhook_id: str) -> ledger.Receipt:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    return found


def same_answer(a: httpx.Response, b: httpx.Response) -> bool:
    return (a.status_code, a.content, a.headers["content-type"]) == (
        b.status_code,
        b.content,
        b.headers["content-type"],
    )


# -- T1 and replays ---------------------------------------------------------------------------


async def test_duplicate_delivery_is_replayed_byte_for_byte(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    async with await open_client(rx) as client:
        body = body_of(order="o-1")
        first = await post(client, "msg_1", body, clock)
        clock.advance(30)
        second = await post(client, "msg_1", body, clock)
    assert first.status_code == 200
    assert "idempotent-replayed" not in first.headers
    assert second.headers["idempotent-replayed"] == "true"
    assert same_answer(first, second)
    assert await effects(store, "msg_1") == 1
    assert recorder.calls["msg_1"] == 1


async def test_reserialized_payload_is_still_a_replay(app, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    first = await post(
        client, "msg_1", b'{"type": "order.created", "data": {"a": 1, "b": 2}}', clock
    )
    second = await post(client, "msg_1", b'{"data":{"b":2,"a":1},"type":"order.created"}', clock)
    assert second.headers["idempotent-replayed"] == "true"
    assert same_answer(first, second)


async def test_same_id_with_another_payload_is_422(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    async with await open_client(rx) as client:
        await post(client, "msg_1", body_of(order="o-1"), clock)
        other = await post(client, "msg_1", body_of(order="o-2"), clock)
    assert other.status_code == 422
    assert other.json()["error"] == "payload_mismatch"
    assert recorder.calls["msg_1"] == 1
    assert await effects(store) == 1


# -- handler outcomes -------------------------------------------------------------------------


async def test_handler_exception_rolls_back_and_releases(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    recorder.fail_next("msg_1")
    body = body_of(order="o-1")
    async with await open_client(rx) as client:
        failed = await post(client, "msg_1", body, clock)
        assert failed.status_code == 500
        assert failed.json()["error"] == "handler_failed"
        assert await effects(store) == 0  # the handler's write rolled back
        released = await row(store, "msg_1")
        assert released.state == "released"
        assert released.attempts == 1
        assert "RuntimeError" in (released.last_error or "")
        async with store.acquire() as conn:
            attempts = await conn.run_all("list_attempts", PROVIDER, "msg_1")
        assert [a["fence"] for a in attempts] == [1]

        retried = await post(client, "msg_1", body, clock)
    assert retried.status_code == 200
    assert retried.json()["fence"] == 2
    assert await effects(store) == 1
    assert recorder.calls["msg_1"] == 2


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_handler_5xx_is_never_stored(store: Store, clock: Clock, status: int) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    body = body_of(mode="status", status=status)
    async with await open_client(rx) as client:
        first = await post(client, "msg_1", body, clock)
        second = await post(client, "msg_1", body, clock)
    assert first.status_code == second.status_code == 500
    assert "idempotent-replayed" not in second.headers
    assert recorder.calls["msg_1"] == 2  # released each time: the retry runs again
    assert await effects(store) == 0
    assert (await row(store, "msg_1")).state == "released"


async def test_handler_429_is_passed_through_and_released(store: Store, clock: Clock) -> None:
    rx, _recorder = make_receiver(store, clock=clock)
    async with await open_client(rx) as client:
        answer = await post(client, "msg_1", body_of(mode="status", status=429), clock)
    assert answer.status_code == 429
    assert (await row(store, "msg_1")).state == "released"


async def test_handler_4xx_is_final_and_replayed(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    body = body_of(mode="status", status=422)
    async with await open_client(rx) as client:
        first = await post(client, "msg_1", body, clock)
        second = await post(client, "msg_1", body, clock)
    assert first.status_code == 422
    assert first.json() == {"answer": 422}
    assert same_answer(first, second)
    assert second.headers["idempotent-replayed"] == "true"
    assert recorder.calls["msg_1"] == 1


async def test_handler_410_is_answered_as_400(store: Store, clock: Clock) -> None:
    rx, _ = make_receiver(store, clock=clock)
    async with await open_client(rx) as client:
        answer = await post(client, "msg_1", body_of(mode="status", status=410), clock)
        again = await post(client, "msg_1", body_of(mode="status", status=410), clock)
    assert answer.status_code == 400
    assert same_answer(answer, again)


async def test_unhandled_type_is_ignored_and_recorded(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    first = await post(client, "msg_1", body_of("customer.deleted"), clock)
    second = await post(client, "msg_1", body_of("customer.deleted"), clock)
    assert first.status_code == 200
    assert first.json() == {"status": "ignored"}
    assert second.headers["idempotent-replayed"] == "true"
    assert (await row(store, "msg_1")).state == "completed"


@pytest.mark.parametrize(
    "body",
    [b"not json", b"\xff\xfe\x00", b"[1, 2]", b'{"data": {}}', b'{"type": 7}', b'{"type": ""}'],
)
async def test_verified_but_invalid_payload_is_a_final_400(  # type: ignore[no-untyped-def]
    app, store: Store, clock: Clock, body: bytes
) -> None:
    client, _ = app
    first = await post(client, "msg_1", body, clock)
    second = await post(client, "msg_1", body, clock)
    assert first.status_code == 400
    assert first.json()["error"] == "invalid_payload"
    assert same_answer(first, second)
    assert second.headers["idempotent-replayed"] == "true"
    assert (await row(store, "msg_1")).state == "failed"
    assert await effects(store) == 0


# -- in flight, leases, fences, expiry --------------------------------------------------------


def claim_of(webhook_id: str, body: bytes, now: float, lease: float = 60.0) -> Claim:
    from receiver._verification.payload import parse

    parsed = parse(body, None)
    return Claim(
        Key(PROVIDER, webhook_id), parsed.payload_hash, parsed.event_type, body, now, lease, 3600
    )


async def test_in_flight_duplicate_is_409_with_retry_after(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    body = body_of(order="o-1")
    async with store.acquire() as conn:  # another worker's live claim
        claimed = await ledger.claim(conn, claim_of("msg_1", body, clock.now))
        assert isinstance(claimed, ledger.Claimed)
        assert claimed.fence == 1
    clock.advance(20)
    answer = await post(client, "msg_1", body, clock)
    assert answer.status_code == 409
    assert answer.json()["error"] == "in_flight"
    assert 1 <= int(answer.headers["retry-after"]) <= 40
    assert await effects(store) == 0


async def test_expired_lease_is_reclaimed_with_the_next_fence(  # type: ignore[no-untyped-def]
    app, store: Store, clock: Clock
) -> None:
    client, _ = app
    body = body_of(order="o-1")
    async with store.acquire() as conn:  # a worker that claimed, then died
        await ledger.claim(conn, claim_of("msg_1", body, clock.now))
    clock.advance(61)
    answer = await post(client, "msg_1", body, clock)
    assert answer.status_code == 200
    assert answer.json()["fence"] == 2
    # The dead worker's late completion is refused by the fence.
    async with store.acquire() as conn:
        with pytest.raises(ledger.LeaseLost):
            await ledger.complete(
                conn, Key(PROVIDER, "msg_1"), 1, ledger.StoredResponse(200, "x", b""), clock.now
            )
    assert await effects(store) == 1


async def test_expired_receipt_is_forgotten(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    window = rx.providers[PROVIDER].window.window
    async with await open_client(rx) as client:
        await post(client, "msg_1", body_of(order="o-1"), clock)
        clock.advance(window + 1)
        again = await post(client, "msg_1", body_of(order="o-2"), clock)
    assert again.status_code == 200
    assert "idempotent-replayed" not in again.headers
    assert recorder.calls["msg_1"] == 2
    receipt = await row(store, "msg_1")
    assert receipt.fence == 2
    assert receipt.expires_at == pytest.approx(clock.now + window)


async def test_receipt_expiry_is_claimed_at_plus_window(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, rx = app
    await post(client, "msg_1", body_of(), clock)
    receipt = await row(store, "msg_1")
    assert receipt.claimed_at == pytest.approx(clock.now)
    assert receipt.expires_at - receipt.claimed_at == pytest.approx(
        rx.providers[PROVIDER].window.window
    )


async def test_late_worker_is_fenced_out(pg_store: PostgresStore, clock: Clock) -> None:
    """A handler outlives its lease; a redelivery takes over and completes; the late worker's
    transaction rolls back, so its business write vanishes."""
    rx = Receiver(
        ledger_clock(pg_store, clock), [Provider(PROVIDER, [SECRET], lease=10)], clock=clock
    )
    entered, release = asyncio.Event(), asyncio.Event()

    @rx.on("order.created")
    async def slow(event: Event, tx: Connection) -> dict[str, int]:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if event.fence == 1:
            entered.set()
            await release.wait()
        return {"fence": event.fence}

    body = body_of()
    async with await open_client(rx) as client:
        late = asyncio.create_task(post(client, "msg_1", body, clock))
        await entered.wait()
        clock.advance(11)
        second = await post(client, "msg_1", body, clock)
        release.set()
        first = await late
    assert second.json() == {"fence": 2}
    assert first.status_code == 409
    assert await effects(pg_store) == 1
    assert (await row(pg_store, "msg_1")).response.body == b'{"fence":2}'  # type: ignore[union-attr]


# -- rejections that never touch the store ----------------------------------------------------


async def test_bad_signature_is_401_and_writes_nothing(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    body = body_of()
    headers = signed("msg_1", body, timestamp=clock.now, secret="whsec_" + "A" * 32)
    answer = await client.post(f"/{PROVIDER}", content=body, headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error"] == "signature"
    assert await receipt_count(store) == 0


async def test_old_timestamp_is_401(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    body = body_of()
    headers = signed("msg_1", body, timestamp=clock.now - 301)
    answer = await client.post(f"/{PROVIDER}", content=body, headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error"] == "timestamp"
    assert await receipt_count(store) == 0


async def test_body_over_the_limit_is_413(store: Store, clock: Clock) -> None:
    rx, _ = make_receiver(store, clock=clock, max_body_size=100)
    body = body_of(pad="x" * 200)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 50):
            yield body[i : i + 50]

    async with await open_client(rx) as client:
        declared = await post(client, "msg_1", body, clock)
        streamed = await client.post(  # chunked: no Content-Length to trust
            f"/{PROVIDER}", content=chunks(), headers=signed("msg_1", body, timestamp=clock.now)
        )
    assert declared.status_code == streamed.status_code == 413
    assert await receipt_count(store) == 0


async def test_routing_errors(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    unknown = await post(client, "msg_1", body_of(), clock, path="nobody")
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "unknown_provider"
    for verb in ("GET", "PUT", "DELETE"):
        unknown = await client.request(verb, "/nobody")
        assert unknown.status_code == 404, verb  # whatever the method, as the HTTP reference says
        assert unknown.json()["error"] == "unknown_provider"
    method = await client.get(f"/{PROVIDER}")
    assert method.status_code == 405
    assert method.json()["error"] == "method_not_allowed"
    assert method.headers["allow"] == "POST"
    assert await receipt_count(store) == 0


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
async def test_store_unavailable_is_503_and_runs_nothing(tmp_path, clock: Clock, kind: str) -> None:  # type: ignore[no-untyped-def]
    store: Store = (
        PostgresStore(f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout=1)
        if kind == "postgresql"
        else SQLiteStore(tmp_path / "missing-dir" / "receipts.db")
    )
    rx = Receiver(ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock)
    ran = []

    @rx.on("*")
    async def handler(event: Event, tx: Connection) -> None:
        ran.append(event.id)

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=rx), base_url="http://test"
    ) as client:
        answer = await post(client, "msg_1", body_of(), clock)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["error"] == "store_unavailable"
    assert ran == []


# -- handlers ---------------------------------------------------------------------------------


async def test_handlers_run_in_order_in_one_transaction(store: Store, clock: Clock) -> None:
    rx = Receiver(ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock)
    order: list[str] = []

    async def write(tx: Connection, event: Event, note: str) -> None:
        order.append(note)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            note,
        )

    @rx.on("*")
    async def everything(event: Event, tx: Connection) -> None:
        await write(tx, event, "*")
        if event.payload["data"].get("fail"):
            raise RuntimeError("last handler fails")

    @rx.on("invoice.*")
    async def invoices(event: Event, tx: Connection) -> None:
        await write(tx, event, "invoice.*")

    @rx.on("invoice.paid")
    async def paid(event: Event, tx: Connection) -> dict[str, str]:
        await write(tx, event, "invoice.paid")
        return {"answer": "from the exact handler"}

    rx.on_startup(
        lambda conn: conn.execute(
            "CREATE TABLE IF NOT EXISTS effects"
            " (provider TEXT, webhook_id TEXT, fence INTEGER, note TEXT)"
        )
    )
    async with await open_client(rx) as client:
        ok = await post(client, "msg_1", body_of("invoice.paid"), clock)
        assert order == ["invoice.paid", "invoice.*", "*"]
        assert ok.json() == {"answer": "from the exact handler"}
        assert await effects(store) == 3
        failed = await post(client, "msg_2", body_of("invoice.paid", fail=True), clock)
    assert failed.status_code == 500
    assert await effects(store, "msg_2") == 0  # all three writes rolled back together


async def test_event_carries_the_delivery(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, rx = app
    seen: list[Event] = []

    @rx.on("thing.happened")
    async def grab(event: Event, tx: Connection) -> Response:
        seen.append(event)
        return Response(b"<ok/>", 201, media_type="application/xml")

    body = body_of("thing.happened", n=1)
    answer = await post(client, "msg_1", body, clock)
    again = await post(client, "msg_1", body, clock)
    assert answer.status_code == 201
    assert again.headers["content-type"] == "application/xml"
    assert again.content == b"<ok/>"
    (event,) = seen
    assert (event.provider, event.id, event.type, event.fence) == (
        PROVIDER,
        "msg_1",
        "thing.happened",
        1,
    )
    assert event.payload == orjson.loads(body)
    assert event.body == body
    assert event.headers["webhook-id"] == "msg_1"
    assert event.timestamp is not None
    assert event.timestamp.timestamp() == int(T0)
    assert event.idempotency_key("refund") == f"{PROVIDER}:refund:msg_1:v1"


async def test_mounted_into_a_starlette_app(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    host = Starlette(routes=[Mount("/webhooks", rx)], lifespan=rx.lifespan)
    async with (
        host.router.lifespan_context(host),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=host), base_url="http://test"
        ) as client,
    ):
        body = body_of()
        answer = await client.post(
            f"/webhooks/{PROVIDER}",
            content=body,
            headers=signed("msg_1", body, timestamp=clock.now),
        )
    assert answer.status_code == 200
    assert recorder.calls["msg_1"] == 1


# -- the handlers' deferred transaction ------------------------------------------------------


async def test_raw_needs_the_transaction_begun(store: Store, clock: Clock) -> None:
    """tx.raw inside a handler must not let writes escape the receipt's transaction."""
    rx = Receiver(ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock)
    seen: list[str] = []

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("raw.early")
    async def early(event: Event, tx: Connection) -> None:
        try:
            tx.raw  # noqa: B018 - the access itself is what is tested
        except ReceiverError as exc:
            seen.append(str(exc))
            raise

    @rx.on("raw.begun")
    async def begun(event: Event, tx: Connection) -> None:
        await tx.begin()
        raw = tx.raw
        query = "INSERT INTO effects (provider, webhook_id, fence) VALUES ({}, {}, {})"
        marks = ("$1", "$2", "$3") if tx.dialect == "postgresql" else ("?", "?", "?")
        args = (event.provider, event.id, event.fence)
        if tx.dialect == "postgresql":
            await raw.execute(query.format(*marks), *args)
        else:
            await raw.execute(query.format(*marks), args)
        if event.payload["data"].get("fail"):
            raise RuntimeError("after a raw write")

    async with await open_client(rx) as client:
        refused = await post(client, "msg_1", body_of("raw.early"), clock)
        ok = await post(client, "msg_2", body_of("raw.begun"), clock)
        failed = await post(client, "msg_3", body_of("raw.begun", fail=True), clock)
    assert refused.status_code == 500
    assert "await tx.begin()" in seen[0]
    assert ok.status_code == 200
    assert failed.status_code == 500
    assert await effects(store, "msg_2") == 1
    assert await effects(store, "msg_3") == 0  # the raw write rolled back with the attempt


async def test_a_handler_that_never_uses_tx_still_completes_under_its_fence(
    store: Store, clock: Clock
) -> None:
    rx = Receiver(ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock)

    @rx.on("ping")
    async def ping(event: Event, tx: Connection) -> dict[str, int]:
        return {"fence": event.fence}

    async with await open_client(rx) as client:
        first = await post(client, "msg_1", body_of("ping"), clock)
        again = await post(client, "msg_1", body_of("ping"), clock)
    assert first.json() == {"fence": 1}
    assert same_answer(first, again)
    assert (await row(store, "msg_1")).state == "completed"


# -- the replay cache --------------------------------------------------------------------------


async def forget(store: Store, webhook_id: str) -> None:
    """Delete a receipt behind the receiver's back (only a test does this)."""
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_receipts WHERE webhook_id = $1", webhook_id)


async def test_completed_receipts_are_replayed_from_memory(store: Store, clock: Clock) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    body = body_of(order="o-1")
    async with await open_client(rx) as client:
        first = await post(client, "msg_1", body, clock)
        await forget(store, "msg_1")
        # No round trip: the process remembers the completed receipt.
        again = await post(client, "msg_1", body, clock)
        other = await post(client, "msg_1", body_of(order="o-2"), clock)
    assert same_answer(first, again)
    assert again.headers["idempotent-replayed"] == "true"
    assert other.status_code == 422
    assert recorder.calls["msg_1"] == 1


async def test_the_replay_cache_respects_the_window_and_can_be_disabled(
    store: Store, clock: Clock
) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    uncached, recorder2 = make_receiver(store, clock=clock, replay_cache=0)
    body = body_of(order="o-1")
    async with await open_client(rx) as client, await open_client(uncached) as plain:
        await post(client, "msg_1", body, clock)
        await forget(store, "msg_1")
        assert (await post(plain, "msg_1", body, clock)).json()["fence"] == 1  # ran again
        clock.advance(rx.providers[PROVIDER].window.window + 1)
        late = await post(client, "msg_1", body, clock)
    assert "idempotent-replayed" not in late.headers  # expired in the cache as in the ledger
    assert recorder.calls["msg_1"] == 2
    assert recorder2.calls["msg_1"] == 1


async def test_failed_receipts_are_not_cached(app, store: Store, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    client, _ = app
    await post(client, "msg_1", b"not json", clock)
    await forget(store, "msg_1")
    again = await post(client, "msg_1", b"not json", clock)
    assert again.status_code == 400
    assert "idempotent-replayed" not in again.headers  # recorded anew, not from memory


async def test_the_replay_cache_matches_reserialized_payloads_too(
    store: Store, clock: Clock
) -> None:
    rx, recorder = make_receiver(store, clock=clock)
    async with await open_client(rx) as client:
        first = await post(client, "msg_1", b'{"type": "order.created", "data": {"a": 1}}', clock)
        await forget(store, "msg_1")
        same = await post(client, "msg_1", b'{"data":{"a":1},"type":"order.created"}', clock)
    assert same_answer(first, same)
    assert same.headers["idempotent-replayed"] == "true"
    assert recorder.calls["msg_1"] == 1


# -- headers a handler sets (issue 14, item 16) -----------------------------------------------


async def test_a_handlers_headers_reach_the_sender_and_are_replayed(
    store: Store, clock: Clock
) -> None:
    rx = Receiver(ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock)

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> Response:
        return Response(
            b"created",
            201,
            headers={"Location": "/orders/o-1", "X-Order-Id": "o-1"},
            media_type="text/plain; charset=utf-8",
        )

    body = body_of()
    async with await open_client(rx) as client:
        first = await post(client, "msg_1", body, clock)
        forget_cache(rx)
        again = await post(client, "msg_1", body, clock)
    for answer in (first, again):
        assert answer.status_code == 201
        assert answer.content == b"created"
        assert answer.headers["location"] == "/orders/o-1"
        assert answer.headers["x-order-id"] == "o-1"
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert again.headers["idempotent-replayed"] == "true"
    assert [(k, v) for k, v in first.headers.items() if k != "idempotent-replayed"] == [
        (k, v) for k, v in again.headers.items() if k != "idempotent-replayed"
    ]


async def test_a_429_keeps_its_retry_after_and_no_invented_content_type(
    store: Store, clock: Clock
) -> None:
    rx = Receiver(ledger_clock(store, clock), [Provider(PROVIDER, [SECRET])], clock=clock)

    @rx.on("order.created")
    async def busy(event: Event, tx: Connection) -> Response:
        return Response("slow down", 429, headers={"Retry-After": "30"})

    async with await open_client(rx) as client:
        answer = await post(client, "msg_1", body_of(), clock)
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "30"
    assert "content-type" not in answer.headers
    assert answer.content == b"slow down"


def forget_cache(rx: Receiver) -> None:
    """Drop the process's replay cache, so the next replay comes from the ledger."""
    if rx.pipeline.cache is not None:
        rx.pipeline.cache.clear()
