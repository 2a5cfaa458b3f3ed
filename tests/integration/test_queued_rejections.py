"""A queued delivery whose handler answers a final 4xx (receiver/_webhooks/rejections.py), on
both stores (PostgreSQL's workers run the transactional ones in group transactions): the
sender keeps its 202, byte for byte, and the rejection is a visible outcome, failed and not
retried, in ``receiver inspect``, ``receiver failed``, the console and the metrics."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import pytest
from starlette.responses import JSONResponse, Response

from receiver import Event, Provider, Receiver, State, Store
from receiver._cli.main import main
from receiver._console import Console
from receiver._ledger.receipts import Claim, Key
from receiver._store.base import Connection
from tests.integration.test_queued import QUEUED_BODY, drain, receipt
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, Clock, body_of, effects, signed

REJECTED = "HandlerRejected: the handler answered 422"


def rejecting_receiver(store: Store, clock: Clock) -> Receiver:
    """Queued; ``order.*`` writes an effects row, then rejects ``bad-*`` deliveries with 422;
    ``ping.*`` writes nothing and rejects ``bad-*`` with 409."""
    store.clock = clock
    rx = Receiver(store, [Provider(PROVIDER, [SECRET], mode="queued")], clock=clock)

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def order(event: Event, tx: Connection) -> Any:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        if event.id.startswith("bad-"):
            return JSONResponse({"error": "unknown customer"}, status_code=422)
        return {"ok": True}

    @rx.on("ping.*")
    async def ping(event: Event, tx: Connection) -> Response | None:
        if event.id.startswith("bad-"):
            return Response(b"stale ping", status_code=409, media_type="text/plain")
        return None

    return rx


async def deliver(rx: Receiver, webhook_id: str, body: bytes, clock: Clock) -> Response:
    return await rx.deliver(PROVIDER, signed(webhook_id, body, timestamp=clock()), body)


async def test_a_handlers_final_4xx_on_a_queued_delivery_is_a_visible_failure(
    store: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    rx = rejecting_receiver(store, clock)
    assert rx.metrics is not None
    deliveries = {
        "ok-1": body_of(order=1),
        "ok-2": body_of(order=2),
        "bad-order": body_of(order=3),
        "ok-3": body_of(order=4),
        "ok-ping": body_of("ping.sent", n=1),
        "bad-ping": body_of("ping.sent", n=2),
    }
    async with rx:
        first = {}
        for webhook_id, body in deliveries.items():
            first[webhook_id] = await deliver(rx, webhook_id, body, clock)
            assert (first[webhook_id].status_code, first[webhook_id].body) == (202, QUEUED_BODY)
        assert await drain(rx) == {"executed": 4, "handler_rejected": 2}
        for webhook_id, status in (("bad-order", 422), ("bad-ping", 409)):
            rejected = await receipt(store, webhook_id)
            assert rejected.state is State.FAILED  # final, and not completed
            assert rejected.attempts == 1
            assert rejected.last_error.startswith(
                f"HandlerRejected: the handler answered {status}, a final answer: not retried"
            )
            assert rejected.request_body == deliveries[webhook_id]  # kept for a replay
            # The sender's answer stays the 202, byte for byte.
            assert rejected.response is not None
            assert (rejected.response.status, rejected.response.body) == (202, QUEUED_BODY)
            rx.pipeline.cache = None
            again = await deliver(rx, webhook_id, deliveries[webhook_id], clock)
            assert (again.status_code, again.body) == (202, QUEUED_BODY)
            assert again.headers["content-type"] == first[webhook_id].headers["content-type"]
            assert again.headers["idempotent-replayed"] == "true"
        assert (await receipt(store, "ok-1")).state is State.COMPLETED
        assert await drain(rx) == {}  # a final answer: nothing is retried
        assert await effects(store, "bad-order") == 1  # its writes commit, as an inline 4xx's
        registry = rx.metrics.registry
        labels = {"provider": PROVIDER}
        counted = {
            outcome: registry.get_sample_value(
                "receiver_queue_attempts_total", {**labels, "outcome": outcome}
            )
            for outcome in ("executed", "handler_rejected", "dead_letter")
        }
        assert counted == {"executed": 4, "handler_rejected": 2, "dead_letter": 0}

        transport = httpx.ASGITransport(app=Console(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            listed = await client.get("/attention", params={"list": "failed"})
            shown = await client.get("/receipt", params={"provider": PROVIDER, "id": "bad-order"})
            receipts = await client.get("/receipts", params={"provider": PROVIDER})
        assert listed.status_code == shown.status_code == receipts.status_code == 200
        assert "bad-order" in listed.text
        assert "bad-ping" in listed.text
        assert "ok-1" not in listed.text
        assert listed.text.count("rejected by handler") == 2
        assert "rejected by handler" in receipts.text
        assert "rejected by its handler: HTTP 422" in shown.text
        assert REJECTED in shown.text
        assert "Its handler answered 422" in shown.text

    assert await asyncio.to_thread(main, ["failed", "--store", store_url]) == 0
    out = capsys.readouterr().out
    assert f"{PROVIDER}/bad-order  failed (rejected by its handler: HTTP 422)" in out
    assert f"{PROVIDER}/bad-ping  failed (rejected by its handler: HTTP 409)" in out
    assert "ok-" not in out
    assert (
        await asyncio.to_thread(main, ["inspect", PROVIDER, "bad-order", "--store", store_url]) == 0
    )
    out = capsys.readouterr().out
    assert "state        failed (fence 1) - REJECTED BY ITS HANDLER (HTTP 422; not retried)" in out
    assert "  fence 1 at " in out
    assert REJECTED in out
    assert "response     202 application/json (19 bytes) - the sender's answer" in out
    assert await asyncio.to_thread(main, ["inspect", PROVIDER, "ok-1", "--store", store_url]) == 0
    assert "REJECTED" not in capsys.readouterr().out


async def test_a_queued_body_that_cannot_be_run_fails_with_its_reason(
    store: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Queued mode answers a body that cannot be run 400 at once; one queued all the same (by
    another program writing to the ledger) fails at its first attempt
    with the reason as its error, never a payload value, the 202 kept, the body kept."""
    clock = Clock()
    rx = rejecting_receiver(store, clock)
    window = rx.providers[PROVIDER].window.window
    bodies = {
        "not-json": b'{"card": "4242424242424242", ',
        "no-type": b'{"data": {"card": "4242424242424242"}}',
    }
    reasons = {
        "not-json": "InvalidPayload: the body is not valid JSON; not retried",
        "no-type": 'InvalidPayload: the body must be a JSON object with a "type": a string of '
        "1-255 characters without control characters; not retried",
    }
    async with rx:
        for webhook_id, body in bodies.items():
            digest = hashlib.sha256(body).digest()
            claim = Claim(Key(PROVIDER, webhook_id), digest, None, body, store.now(), 30.0, window)
            assert (await rx.pipeline.ingest.submit(claim)).inserted
        assert await drain(rx) == {"invalid_payload": 2}
        for webhook_id, body in bodies.items():
            failed = await receipt(store, webhook_id)
            assert failed.state is State.FAILED
            assert failed.attempts == 1
            assert failed.last_error == reasons[webhook_id]
            assert failed.request_body == body
            assert failed.response is not None
            assert (failed.response.status, failed.response.body) == (202, QUEUED_BODY)
        assert await drain(rx) == {}  # not retried
    assert await asyncio.to_thread(main, ["failed", "--store", store_url]) == 0
    out = capsys.readouterr().out
    for webhook_id in bodies:
        assert f"{PROVIDER}/{webhook_id}  failed  " in out
    assert "InvalidPayload: the body is not valid JSON" in out
    assert "4242" not in out
