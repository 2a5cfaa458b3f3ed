"""A handed-off delivery (receiver/_webhooks/handoff.py) whose handler then answers: its
sender was told 202 at its time limit, so the 202 is its answer for good, replayed byte for
byte, and a final 4xx of the handler is a visible failure, as a queued delivery's is
(receiver/_webhooks/rejections.py). Real SQLite and PostgreSQL (both layouts), over ASGI HTTP.

The provider's ``timeout`` is 1.5 s, so the budget is 1.0 s; the slow handlers sleep 2 s.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.responses import JSONResponse, Response

from receiver import Connection, Event, Provider, Receiver, State, Store
from receiver._cli.main import main
from receiver._console import Console
from receiver._webhooks.groups import GROUP_MIN
from tests.integration.test_handoff import post
from tests.integration.test_queued import QUEUED_BODY, receipt
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, effects

TIMEOUT = 1.5
SLOW = 2.0
REJECTED = (
    "HandlerRejected: the handler answered {status}, a final answer: not retried (its sender "
    "was answered 202 when the delivery was handed off)"
)


def slow_receiver(store: Store) -> Receiver:
    """Handoff; ``order.*`` sleeps ``SLOW`` s, writes an effects row, then answers 422 to
    ``bad-*`` deliveries and a body of its own to the others; ``ping.*`` writes nothing,
    sleeps, then answers ``bad-*`` with 409."""
    rx = Receiver(
        store,
        [Provider(PROVIDER, [SECRET], timeout=TIMEOUT, handoff=True)],
        sweep_interval=None,
    )

    @rx.on_startup
    async def create(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.*")
    async def order(event: Event, tx: Connection) -> Any:
        # Slow before its write: SQLite's one writer is not held while it sleeps, so that
        # the other deliveries claim their keys (and may be handed off) meanwhile.
        await asyncio.sleep(SLOW)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        if event.id.startswith("bad-"):
            return JSONResponse({"error": "unknown customer"}, status_code=422)
        return {"done": event.id}

    @rx.on("ping.*")
    async def ping(event: Event, tx: Connection) -> Response | None:
        await asyncio.sleep(SLOW)
        if event.id.startswith("bad-"):
            return Response(b"stale ping", status_code=409, media_type="text/plain")
        return None

    return rx


async def finished(rx: Receiver) -> None:
    """Wait for the handed-off deliveries to end."""
    await asyncio.wait(set(rx.handoffs.tasks), timeout=SLOW + 10)
    assert not rx.handoffs.tasks


async def test_a_handed_off_delivery_keeps_its_202_and_a_final_4xx_is_a_visible_failure(
    store: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rx = slow_receiver(store)
    assert rx.metrics is not None
    deliveries = {
        "ok-order": body_of(order=1),
        "bad-order": body_of(order=2),
        "ok-ping": body_of("ping.sent", n=1),
        "bad-ping": body_of("ping.sent", n=2),
    }
    async with rx:
        answers = await asyncio.gather(*(post(rx, i, b) for i, b in deliveries.items()))
        first = dict(zip(deliveries, (answer for answer, _ in answers), strict=True))
        for answer, took in answers:
            assert (answer.status_code, answer.content) == (202, QUEUED_BODY)
            assert took < TIMEOUT
        await finished(rx)
        for webhook_id, status in (("bad-order", 422), ("bad-ping", 409)):
            rejected = await receipt(store, webhook_id)
            assert rejected.state is State.FAILED  # final, and not completed
            assert rejected.attempts == 1
            assert rejected.last_error == REJECTED.format(status=status)
            assert rejected.request_body == deliveries[webhook_id]  # kept for a replay
        for webhook_id in deliveries:
            # What the sender got, the 202, is what is stored, whatever the handler answered.
            stored = (await receipt(store, webhook_id)).response
            assert (stored.status, stored.body) == (202, QUEUED_BODY)
        assert (await receipt(store, "ok-order")).state is State.COMPLETED
        assert (await receipt(store, "ok-ping")).state is State.COMPLETED
        for cached in (True, False):  # this process's replay cache, then the ledger
            if not cached:
                rx.pipeline.cache = None
            for webhook_id, body in deliveries.items():
                again, _ = await post(rx, webhook_id, body)
                assert (again.status_code, again.content) == (202, QUEUED_BODY)
                assert again.headers["content-type"] == first[webhook_id].headers["content-type"]
                assert again.headers["idempotent-replayed"] == "true"
        assert await effects(store, "bad-order") == 1  # its writes commit, as an inline 4xx's
        assert await effects(store, "ok-order") == 1
        registry = rx.metrics.registry
        counted = {
            outcome: registry.get_sample_value(
                "receiver_deliveries_total",
                {"provider": PROVIDER, "outcome": outcome, "reason": ""},
            )
            for outcome in ("handed_off", "executed", "handler_rejected", "replayed")
        }
        assert counted == {"handed_off": 4, "executed": 2, "handler_rejected": 2, "replayed": 8}

        transport = httpx.ASGITransport(app=Console(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            listed = await client.get("/attention", params={"list": "failed"})
            shown = await client.get("/receipt", params={"provider": PROVIDER, "id": "bad-order"})
        assert listed.status_code == shown.status_code == 200
        assert listed.text.count("rejected by handler") == 2
        assert "ok-order" not in listed.text
        assert "rejected by its handler: HTTP 422" in shown.text
        assert "handed off at the sender's time limit" in shown.text

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
    assert REJECTED.format(status=422) in out
    assert "response     202 application/json (19 bytes) - the sender's answer" in out


async def test_handed_off_members_of_an_inline_group_transaction_store_their_202(
    store: Store,
) -> None:
    """PostgreSQL runs concurrent inline deliveries whose handlers write in group transactions
    (receiver/_webhooks/groups.py): members handed off while their group runs are finished by
    the group's completions, with the 202 stored, and those their handler rejected failed."""
    if store.dialect != "postgresql":
        pytest.skip("inline group transactions are PostgreSQL's")
    rx = slow_receiver(store)
    calls: list[str] = []

    @rx.on("batch.*")
    async def batch(event: Event, tx: Connection) -> Any:
        calls.append(event.id)
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        # The first delivery runs alone; the group's last member holds the group's
        # transaction past the budget, so that all its members are handed off.
        if len(calls) in (1, GROUP_MIN + 1):
            await asyncio.sleep(SLOW)
        if event.id.startswith("bad-"):
            return JSONResponse({"error": "unknown customer"}, status_code=422)
        return {"done": event.id}

    async with rx:
        # One delivery running alone, so that the next ones wait for a group to begin.
        blocker = asyncio.create_task(post(rx, "ok-blocker", body_of("batch.sent", n=-1)))
        await asyncio.sleep(0.3)
        ids = [f"{'bad' if n % 2 else 'ok'}-{n}" for n in range(GROUP_MIN)]
        answers = await asyncio.gather(*(post(rx, i, body_of("batch.sent", n=i)) for i in ids))
        answers.append(await blocker)
        await finished(rx)
        assert len(calls) == GROUP_MIN + 1
        handed_off = set()
        for webhook_id, (answer, _) in zip([*ids, "ok-blocker"], answers, strict=True):
            # Whatever it was, the sender's first answer is the stored one, byte for byte.
            stored = await receipt(store, webhook_id)
            assert (stored.response.status, stored.response.body) == (
                answer.status_code,
                answer.content,
            )
            if answer.status_code == 202:
                handed_off.add(webhook_id.partition("-")[0])
                if webhook_id.startswith("bad-"):
                    assert stored.state is State.FAILED
                    assert stored.last_error == REJECTED.format(status=422)
                else:
                    assert stored.state is State.COMPLETED
            assert await effects(store, webhook_id) == 1
        assert handed_off == {"ok", "bad"}  # both kinds held past the limit by their group
