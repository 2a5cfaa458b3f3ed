"""A server SIGKILLed in the middle of a load of concurrent deliveries, while claims and
completions are being grouped (PostgreSQL's batched statements, SQLite's group commit): no
delivery acknowledged with a 2xx is lost, none is applied twice, and every redelivery after the
crash ends in exactly one committed execution (issue 15, item 4; invariants I2 and I4)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_crash import LEASE, server_env
from tests.servers import start_server
from tests.support import PROVIDER, body_of, query, signed

pytestmark = pytest.mark.slow

COUNT = 200


async def send_all(
    url: str, deliveries: list[tuple[str, bytes]], kill_after: int, kill: Callable[[], None]
) -> dict[str, httpx.Response]:
    """Send every delivery at once; after ``kill_after`` answers, call ``kill``."""
    answers: dict[str, httpx.Response] = {}
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as client:

        async def one(webhook_id: str, body: bytes) -> None:
            try:
                response = await client.post(
                    f"/{PROVIDER}", content=body, headers=signed(webhook_id, body)
                )
            except httpx.HTTPError:
                return  # the server died first: no answer, the sender will retry
            answers[webhook_id] = response
            if len(answers) == kill_after:
                kill()

        await asyncio.gather(*(one(w, b) for w, b in deliveries))
    return answers


async def test_a_kill_under_load_loses_nothing_acknowledged_and_runs_nothing_twice(
    store_url: str, tmp_path: Path
) -> None:
    invocations = tmp_path / "invocations"
    env = server_env(store_url, invocations)
    deliveries = [(f"load_{i}", body_of("order.created", order=f"o-{i}")) for i in range(COUNT)]
    victim = start_server(env, tmp_path / "victim.log")
    try:
        before = await send_all(victim.url, deliveries, COUNT // 4, victim.kill)
    finally:
        victim.kill()
    acknowledged = {w: r for w, r in before.items() if 200 <= r.status_code < 300}
    assert acknowledged, "the server died before acknowledging anything"
    assert len(before) < COUNT, "the server finished the load before it was killed"
    await asyncio.sleep(LEASE + 0.5)  # the dead attempts' leases run out

    survivor = start_server(env, tmp_path / "survivor.log")
    try:
        after = await send_all(survivor.url, deliveries, -1, lambda: None)
    finally:
        survivor.stop()
    assert {r.status_code for r in after.values()} == {200}, {
        w: (r.status_code, r.text) for w, r in after.items() if r.status_code != 200
    }
    for webhook_id, first in acknowledged.items():
        again = after[webhook_id]
        # Acknowledged before the kill: committed, so the redelivery is its replay.
        assert again.headers.get("idempotent-replayed") == "true", webhook_id
        assert again.content == first.content
    rows = await query(
        store_url,
        "SELECT webhook_id, count(*) FROM effects WHERE webhook_id LIKE 'load_%' "
        "GROUP BY webhook_id",
    )
    assert len(rows) == COUNT
    assert all(n == 1 for _, n in rows)
    states = await query(
        store_url,
        "SELECT state, count(*) FROM receiver_receipts WHERE webhook_id LIKE 'load_%' "
        "GROUP BY state",
    )
    assert dict(states) == {"completed": COUNT}
