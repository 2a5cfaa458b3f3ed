"""T3 behind a real PgBouncer in transaction mode (issue 20): a ``receiver serve`` process
whose store URL names the pooler (``?pooler=transaction``) SIGKILLs itself mid-delivery, then
other processes through the same pooler recover it. The pooler holds the dead client's server
session in a transaction until it notices; the claim still decides, and the handler's effect
commits once. The ledger is read directly, not through the pooler."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from tests.acceptance.test_crash import (
    assert_fresh,
    assert_in_flight,
    assert_replay,
    crashing,
    die,
    effect_fences,
    executions,
    post,
    receipt,
    redeliver,
    server_env,
    start_all,
    wait_out,
)
from tests.conftest import POOLED_DATABASE, truncate
from tests.pgbouncer import PgBouncer
from tests.support import body_of, signed

pytestmark = pytest.mark.slow


@pytest.fixture
def pooled(pgbouncers: dict[str, PgBouncer], pooled_database: str) -> tuple[str, str]:
    """(the servers' store URL, through the pooler; the direct URL the test reads with)."""
    asyncio.run(truncate(pooled_database))
    return pgbouncers["transaction"].url(POOLED_DATABASE) + "?pooler=transaction", pooled_database


async def test_a_crash_before_commit_behind_the_pooler_runs_once_more(
    pooled: tuple[str, str], tmp_path: Path
) -> None:
    through, direct = pooled
    invocations = tmp_path / "invocations"
    env = server_env(through, invocations)
    body = body_of(order="o-pooled")
    headers = signed("msg_pooled_crash", body)
    wid = headers["webhook-id"]
    with ExitStack() as stack:
        victim, standby = start_all(
            stack,
            [
                (crashing(env, "before_commit", wid), tmp_path / "victim.log"),
                (env, tmp_path / "standby.log"),
            ],
        )
        dead = die(victim, "before_commit", body, headers)
        assert await effect_fences(direct, wid) == [], "the dead attempt's write must roll back"
        lease_until = await assert_in_flight(direct, headers, redeliver(standby, body, headers))
        (fresh,) = start_all(stack, [(env, tmp_path / "fresh.log")])
        wait_out(lease_until)
        again = post(fresh, body, headers)
        assert_fresh(again, 200, orjson.dumps({"order": "o-pooled", "fence": 2}))
        assert_replay(
            post(standby, body, headers), 200, again.headers["content-type"], again.content
        )
    assert executions(invocations, wid) == [(1, dead), (2, fresh.process.pid)]
    assert await effect_fences(direct, wid) == [2]
    assert (await receipt(direct, wid))["state"] == "completed"


async def test_a_crash_after_commit_behind_the_pooler_replays(
    pooled: tuple[str, str], tmp_path: Path
) -> None:
    through, direct = pooled
    invocations = tmp_path / "invocations"
    env = server_env(through, invocations)
    body = body_of(order="o-after")
    headers = signed("msg_pooled_after", body)
    wid = headers["webhook-id"]
    with ExitStack() as stack:
        (victim,) = start_all(stack, [(crashing(env, "after_commit", wid), tmp_path / "v.log")])
        dead = die(victim, "after_commit", body, headers)
        (fresh,) = start_all(stack, [(env, tmp_path / "fresh.log")])
        answer = post(fresh, body, headers)
        assert answer.headers.get("idempotent-replayed") == "true", answer.content
        assert answer.status_code == 200
    assert executions(invocations, wid) == [(1, dead)]
    assert await effect_fences(direct, wid) == [1]
