"""T4, two server processes on one database receiving the same deliveries.

Two ``receiver serve`` processes share one store (PostgreSQL, and a SQLite file). Each of 200
distinct deliveries is sent to both at once (in alternating order), some get a third concurrent
copy, and some a later fourth one. Whatever the interleaving, every delivery executes exactly
once in total: one fresh 200 per id, every other copy a byte-identical replay or a 409, one
handler invocation and one effects row per id, one completed receipt per id.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import httpx
import orjson
import pytest

from tests.servers import Server, running
from tests.support import PROVIDER, SECRET, body_of, query, signed

pytestmark = pytest.mark.slow

DELIVERIES = 200
CONCURRENCY = 20  # ids in flight at once


def is_replay(answer: httpx.Response) -> bool:
    return answer.headers.get("idempotent-replayed") == "true"


async def test_two_processes_execute_each_delivery_once(store_url: str, tmp_path: Path) -> None:
    invocations = tmp_path / "invocations"
    env = {
        "RECEIVER_STORE": store_url,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        "RECEIVER_TEST_CRASH": "",
        "RECEIVER_TEST_EXTERNAL": "",
        # Widen the window in which copies overlap. On SQLite the handler's transaction holds
        # the file's only write lock, so keep it short there.
        "RECEIVER_TEST_SLOW": "0.02" if store_url.startswith("postgresql") else "0.002",
    }
    # Idle keep-alive connections are dropped well before uvicorn's 5 s keep-alive timeout, so
    # that the client never reuses one the server is closing (a client-side race).
    limits = httpx.Limits(
        max_connections=4 * CONCURRENCY,
        max_keepalive_connections=4 * CONCURRENCY,
        keepalive_expiry=1.0,
    )
    gate = asyncio.Semaphore(CONCURRENCY)
    answers: dict[str, list[httpx.Response]] = {}
    late: dict[str, httpx.Response] = {}

    with (
        running(env, tmp_path / "a.log") as a,
        running(env, tmp_path / "b.log") as b,
    ):
        pids = {a.process.pid, b.process.pid}
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:

            async def post(server: Server, body: bytes, headers: dict[str, str]) -> httpx.Response:
                return await client.post(f"{server.url}/{PROVIDER}", content=body, headers=headers)

            async def deliver(i: int) -> None:
                body = body_of(order=f"o-{i}")
                headers = signed(f"msg_two_{i:03d}", body)
                targets = [a, b] if i % 2 else [b, a]
                if i % 3 == 0:
                    targets.append(targets[i % 2])  # a third concurrent copy
                async with gate:
                    got = await asyncio.gather(*(post(s, body, headers) for s in targets))
                    answers[headers["webhook-id"]] = list(got)
                    if i % 5 == 0:  # a sender's later retry: the receipt is complete by now
                        late[headers["webhook-id"]] = await post(targets[-1], body, headers)

            await asyncio.wait_for(
                asyncio.gather(*(deliver(i) for i in range(DELIVERIES))), timeout=60
            )
        for server in (a, b):
            assert server.process.poll() is None, f"a server died:\n{server.output()}"

    assert len(answers) == DELIVERIES
    outcomes: collections.Counter[str] = collections.Counter()
    for wid, got in answers.items():
        statuses = [g.status_code for g in got]
        assert set(statuses) <= {200, 409}, (wid, statuses, [g.content for g in got])
        fresh = [g for g in got if g.status_code == 200 and not is_replay(g)]
        assert len(fresh) == 1, f"{wid}: {len(fresh)} fresh executions answered: {statuses}"
        order = f"o-{int(wid.rsplit('_', 1)[1])}"
        assert fresh[0].content == orjson.dumps({"order": order, "fence": 1})
        first = (fresh[0].status_code, fresh[0].headers["content-type"], fresh[0].content)
        for g in got:
            if g.status_code == 409:
                assert int(g.headers["retry-after"]) >= 1, g.headers
                outcomes["in_flight"] += 1
            elif is_replay(g):
                assert (g.status_code, g.headers["content-type"], g.content) == first, wid
                outcomes["replayed"] += 1
            else:
                outcomes["executed"] += 1
        if wid in late:
            again = late[wid]
            assert is_replay(again), (wid, again.status_code, again.headers, again.content)
            assert (again.status_code, again.headers["content-type"], again.content) == first
    assert outcomes["executed"] == DELIVERIES, outcomes

    lines = [line.split() for line in invocations.read_text().splitlines()]
    runs = collections.Counter(wid for wid, _, _ in lines)
    assert len(runs) == DELIVERIES
    twice = {wid: n for wid, n in runs.items() if n != 1}
    assert not twice, f"executed more than once: {twice}"
    runners = collections.Counter(int(pid) for _, _, pid in lines)
    assert set(runners) == pids, f"both processes must execute deliveries: {runners} vs {pids}"

    rows = await query(store_url, "SELECT webhook_id, count(*) FROM effects GROUP BY webhook_id")
    assert len(rows) == DELIVERIES
    assert {n for _, n in rows} == {1}, [r for r in rows if r[1] != 1]
    receipts = await query(
        store_url,
        "SELECT state, count(*) FROM receiver_receipts WHERE provider = $1 GROUP BY state",
        PROVIDER,
    )
    assert receipts == [("completed", DELIVERIES)], receipts
