"""Handoff and a crash: a real ``receiver serve`` process answers a slow delivery 202 at its
sender's limit (handoff), and is SIGKILLed while the handler still runs, before its transaction
commits. Nobody will redeliver (the sender was told 202): a fresh process recovers the receipt
from its stored body once the dead attempt's lease has expired (its sweeper), and the effect
commits exactly once. PostgreSQL and a SQLite file.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.acceptance.test_crash import effect_fences, executions, receipt, server_env
from tests.servers import running, start_server
from tests.support import PROVIDER, body_of, signed

pytestmark = pytest.mark.slow

TIMEOUT = 1.5  # the provider's time limit: handed off after 1 s (less the 0.5 s margin)
SLOW = 6.0  # the first process's handler sleeps this long after its write


def test_a_handed_off_delivery_interrupted_by_a_crash_is_recovered_once(
    store_url: str, tmp_path: Path
) -> None:
    invocations = tmp_path / "invocations"
    handoff = {"RECEIVER_TEST_TIMEOUT": str(TIMEOUT), "RECEIVER_TEST_HANDOFF": "1"}
    body = body_of(order="o-handoff")
    headers = signed("msg_handoff_crash", body)
    wid = headers["webhook-id"]

    first = start_server(
        server_env(store_url, invocations, RECEIVER_TEST_SLOW=str(SLOW), **handoff),
        tmp_path / "first.log",
    )
    try:
        began = time.monotonic()
        answer = httpx.post(f"{first.url}/{PROVIDER}", content=body, headers=headers, timeout=15)
        took = time.monotonic() - began
        assert answer.status_code == 202, (answer.status_code, answer.content)
        assert orjson.loads(answer.content) == {"status": "queued"}
        assert took < TIMEOUT
        # The handler is running (it wrote, uncommitted, and sleeps): kill the process now.
        assert [pid for _, pid in executions(invocations, wid)] == [first.process.pid]
        first.kill()
        assert time.monotonic() - began < SLOW, "the handler finished before the kill"
    finally:
        first.kill()
    dead = asyncio.run(receipt(store_url, wid))
    assert (dead["state"], dead["fence"]) == ("in_flight", 1)
    assert dead["body"] is None  # no answer stored: the effect never committed
    assert asyncio.run(effect_fences(store_url, wid)) == []

    # A fresh process, sweeping often: the receipt is recovered after the lease, with no
    # redelivery, from the body stored at the claim.
    fresh_env = server_env(store_url, invocations, RECEIVER_TEST_SWEEP="0.5", **handoff)
    with running(fresh_env, tmp_path / "fresh.log") as fresh:
        deadline = time.monotonic() + 30
        while asyncio.run(receipt(store_url, wid))["state"] != "completed":
            assert time.monotonic() < deadline, f"not recovered:\n{fresh.output()}"
            time.sleep(0.2)
        done = asyncio.run(receipt(store_url, wid))
        assert done["fence"] == 2
        assert asyncio.run(effect_fences(store_url, wid)) == [2]
        runs = executions(invocations, wid)
        assert [fence for fence, _ in runs] == [1, 2]
        assert runs[1][1] == fresh.process.pid
        # A redelivery now replays the stored answer and runs nothing.
        again = httpx.post(f"{fresh.url}/{PROVIDER}", content=body, headers=headers, timeout=15)
        assert again.status_code == 200
        assert again.headers.get("idempotent-replayed") == "true"
        assert orjson.loads(again.content) == {"order": "o-handoff", "fence": 2}
        assert len(executions(invocations, wid)) == 2
    assert asyncio.run(effect_fences(store_url, wid)) == [2]
