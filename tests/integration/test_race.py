"""T2, the race: 100 concurrent copies of one delivery released through one barrier.

Exactly one execution; every other answer is a byte-identical replay or a 409 (in flight).
Run in-process against the ASGI app with a real pool, and through a real uvicorn server over
loopback. The unique constraint of the receipts table is the only thing that can make it pass.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from receiver import PostgresStore, Store
from receiver.testing import Sender, assert_executed_once
from tests.servers import running
from tests.support import PROVIDER, SECRET, body_of, effects, make_receiver, signed

COPIES = 100


def check_answers(answers: list[httpx.Response]) -> None:
    executed = [
        a for a in answers if a.status_code == 200 and "idempotent-replayed" not in a.headers
    ]
    replayed = [a for a in answers if a.headers.get("idempotent-replayed") == "true"]
    in_flight = [a for a in answers if a.status_code == 409]
    assert len(executed) == 1, [a.status_code for a in answers]
    assert len(executed) + len(replayed) + len(in_flight) == COPIES
    first = executed[0]
    for replay in replayed:
        assert (replay.status_code, replay.content, replay.headers["content-type"]) == (
            first.status_code,
            first.content,
            first.headers["content-type"],
        )
    for conflict in in_flight:
        assert int(conflict.headers["retry-after"]) >= 1


async def fire(
    client: httpx.AsyncClient, path: str, body: bytes, headers: dict[str, str]
) -> list[httpx.Response]:
    barrier = asyncio.Barrier(COPIES)

    async def one() -> httpx.Response:
        await barrier.wait()  # every copy starts together
        return await client.post(path, content=body, headers=headers)

    return list(await asyncio.gather(*(one() for _ in range(COPIES))))


async def test_race_in_process(store: Store) -> None:
    """Through receiver.testing (dogfood): its twins and its assertion, on our own test app."""
    rx, recorder = make_receiver(store)
    async with rx, Sender(rx, PROVIDER, SECRET) as sender:
        webhook = sender.event("order.created", {"order": "o-race"}, id="msg_race")
        answers = await sender.twins(webhook, COPIES)
    assert len(answers) == COPIES
    assert_executed_once(answers)
    assert recorder.calls["msg_race"] == 1
    assert await effects(store, "msg_race") == 1


@pytest.mark.slow
async def test_race_through_uvicorn(pg_store: PostgresStore, pg_url: str, tmp_path: Path) -> None:
    invocations = tmp_path / "invocations"
    env = {
        "RECEIVER_STORE": pg_url,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        "RECEIVER_TEST_SLOW": "0.05",  # widen the window in which copies overlap
    }
    body = body_of(order="o-race")
    headers = signed("msg_race", body)
    limits = httpx.Limits(max_connections=COPIES, max_keepalive_connections=COPIES)
    with running(env, tmp_path / "server.log") as server:
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30) as client:
            # Open every connection before the barrier, so the copies race in the server and
            # not in the TCP handshake.
            await asyncio.gather(*(client.get("/") for _ in range(COPIES)))
            answers = await fire(client, f"/{PROVIDER}", body, headers)
    check_answers(answers)
    assert invocations.read_text().count("msg_race") == 1
    assert await effects(pg_store, "msg_race") == 1
