"""T3, crash: a real ``receiver serve`` process SIGKILLs itself at a hook point, then a fresh
process on the same store gets the redelivery. Never two committed executions.

- before_commit: the handler wrote through ``tx`` and the process died before the commit. The
  committed in-flight claim keeps the key: a redelivery within the lease is 409 (Retry-After);
  after the lease it is reclaimed under fence 2 and runs once more; one effects row in the end.
- after_commit: the receipt committed and the process died before answering. The redelivery is
  a byte-identical replay of the stored answer; the handler ran once.
- external handlers (``effects="external"``) are never re-run blindly after such a crash: without
  ``reconcile`` the receipt is marked failed (202 needs_review); ``reconcile`` decides otherwise.

Every case runs on PostgreSQL and on a SQLite file. The test app (tests/apps/server.py) appends
"<id> <fence> <pid>" to the invocations file on every true execution, committed or not.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from tests.conftest import truncate
from tests.servers import Server, running, start_server
from tests.support import PROVIDER, SECRET, body_of, signed

pytestmark = pytest.mark.slow

LEASE = 3  # seconds: long enough to see the 409 from a freshly started server, short to wait out
NEEDS_REVIEW_PREFIX = b'{"status":"needs_review"'


# -- helpers ------------------------------------------------------------------------------------


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store the server processes share: the test database (emptied), or a SQLite file."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        asyncio.run(truncate(url))
        return url
    return f"sqlite:///{tmp_path}/r.db"


async def query(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows from the store, read directly (``$n`` placeholders on both dialects)."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=10)
        try:
            return [tuple(r) for r in db.execute(re.sub(r"\$(\d+)", r"?\1", sql), args)]
        finally:
            db.close()
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def receipt(url: str, webhook_id: str) -> dict[str, Any]:
    lease = (
        "lease_until"
        if url.startswith("sqlite")
        else "extract(epoch FROM lease_until)::float8 AS lease_until"
    )
    rows = await query(
        url,
        "SELECT state, fence, response_status, response_content_type, response_body, "
        f"{lease} FROM receiver_receipts WHERE provider = $1 AND webhook_id = $2",
        PROVIDER,
        webhook_id,
    )
    assert len(rows) == 1, f"expected one receipt for {webhook_id}, found {rows}"
    state, fence, status, content_type, body, lease_until = rows[0]
    return {
        "state": state,
        "fence": fence,
        "status": status,
        "content_type": content_type,
        "body": None if body is None else bytes(body),
        "lease_until": float(lease_until),
    }


async def effect_fences(url: str, webhook_id: str) -> list[int]:
    """The fences of the committed effects rows of one delivery."""
    rows = await query(url, "SELECT fence FROM effects WHERE webhook_id = $1", webhook_id)
    return sorted(int(r[0]) for r in rows)


def executions(path: Path, webhook_id: str) -> list[tuple[int, int]]:
    """(fence, pid) of every true execution of the handler for one delivery, in order."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        wid, fence, pid = line.split()
        if wid == webhook_id:
            found.append((int(fence), int(pid)))
    return found


def server_env(store: str, invocations: Path, **extra: str) -> dict[str, str]:
    return {
        "RECEIVER_STORE": store,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        "RECEIVER_TEST_LEASE": str(LEASE),
        "RECEIVER_TEST_CRASH": "",
        "RECEIVER_TEST_CRASH_IDS": "",
        "RECEIVER_TEST_SLOW": "0",
        "RECEIVER_TEST_EXTERNAL": "",
        **extra,
    }


def post(server: Server, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.url}/{PROVIDER}", content=body, headers=headers, timeout=15)


def crash(env: dict[str, str], log: Path, hook: str, body: bytes, headers: dict[str, str]) -> int:
    """Deliver to a server that SIGKILLs itself at ``hook``; the client sees the connection drop.
    Returns the dead process's pid."""
    server = start_server(
        {**env, "RECEIVER_TEST_CRASH": hook, "RECEIVER_TEST_CRASH_IDS": headers["webhook-id"]},
        log,
    )
    try:
        try:
            answer = post(server, body, headers)
        except httpx.TransportError:
            pass  # the connection dropped: the process died
        else:
            pytest.fail(f"the {hook} hook did not kill the server: {answer.status_code}")
        code = server.process.wait(timeout=10)
        assert code == -signal.SIGKILL, f"server exited with {code}:\n{server.output()}"
    finally:
        server.kill()
    return server.process.pid


def assert_replay(answer: httpx.Response, status: int, content_type: str, body: bytes) -> None:
    assert answer.headers.get("idempotent-replayed") == "true", answer.headers
    assert (answer.status_code, answer.headers["content-type"], answer.content) == (
        status,
        content_type,
        body,
    )


def assert_fresh(answer: httpx.Response, status: int, body: bytes) -> None:
    assert "idempotent-replayed" not in answer.headers, (answer.headers, answer.content)
    assert (answer.status_code, answer.content) == (status, body)


async def assert_in_flight(server: Server, url: str, body: bytes, headers: dict[str, str]) -> float:
    """Within the dead attempt's lease, a redelivery is 409 with Retry-After; returns the lease
    end, so that the caller can wait it out."""
    lease_until = (await receipt(url, headers["webhook-id"]))["lease_until"]
    answer = post(server, body, headers)
    assert time.time() < lease_until, (
        "the fresh server started too slowly: the lease had already expired, so the 409 could "
        "not be observed; raise LEASE"
    )
    assert answer.status_code == 409, (answer.status_code, answer.content)
    assert 1 <= int(answer.headers["retry-after"]) <= LEASE, answer.headers
    return lease_until


def wait_out(lease_until: float) -> None:
    time.sleep(max(0.0, lease_until - time.time()) + 0.2)


# -- transactional handlers -----------------------------------------------------------------------


async def test_crash_before_commit_runs_again_after_the_lease(
    store_url: str, tmp_path: Path
) -> None:
    invocations = tmp_path / "invocations"
    env = server_env(store_url, invocations)
    body = body_of(order="o-before")
    headers = signed("msg_crash_before", body)
    wid = headers["webhook-id"]

    dead = crash(env, tmp_path / "crashed.log", "before_commit", body, headers)
    assert executions(invocations, wid) == [(1, dead)]
    held = await receipt(store_url, wid)
    assert (held["state"], held["fence"], held["status"]) == ("in_flight", 1, None), held
    assert await effect_fences(store_url, wid) == [], "the dead attempt's write must roll back"

    with running(env, tmp_path / "fresh.log") as fresh:
        lease_until = await assert_in_flight(fresh, store_url, body, headers)
        assert executions(invocations, wid) == [(1, dead)], "a 409 must not run the handler"

        wait_out(lease_until)
        again = post(fresh, body, headers)
        assert_fresh(again, 200, orjson.dumps({"order": "o-before", "fence": 2}))
        replayed = post(fresh, body, headers)
        assert_replay(replayed, 200, again.headers["content-type"], again.content)
        fresh_pid = fresh.process.pid

    assert executions(invocations, wid) == [(1, dead), (2, fresh_pid)]
    assert await effect_fences(store_url, wid) == [2]
    done = await receipt(store_url, wid)
    assert (done["state"], done["fence"], done["body"]) == ("completed", 2, again.content)


async def test_crash_after_commit_replays_the_stored_answer(store_url: str, tmp_path: Path) -> None:
    invocations = tmp_path / "invocations"
    env = server_env(store_url, invocations)
    body = body_of(order="o-after")
    headers = signed("msg_crash_after", body)
    wid = headers["webhook-id"]

    dead = crash(env, tmp_path / "crashed.log", "after_commit", body, headers)
    stored = await receipt(store_url, wid)
    expected = orjson.dumps({"order": "o-after", "fence": 1})
    assert (stored["state"], stored["fence"], stored["status"], stored["body"]) == (
        "completed",
        1,
        200,
        expected,
    ), stored
    assert stored["content_type"] == "application/json"

    with running(env, tmp_path / "fresh.log") as fresh:
        first = post(fresh, body, headers)
        second = post(fresh, body, headers)
    for answer in (first, second):
        assert_replay(answer, stored["status"], stored["content_type"], stored["body"])

    assert executions(invocations, wid) == [(1, dead)]
    assert await effect_fences(store_url, wid) == [1]


# -- external handlers --------------------------------------------------------------------------


@pytest.mark.parametrize("reconcile", ["none", "done", "again"])
async def test_crash_of_an_external_handler_is_never_rerun_blindly(
    store_url: str, tmp_path: Path, reconcile: str
) -> None:
    invocations = tmp_path / "invocations"
    env = server_env(
        store_url,
        invocations,
        RECEIVER_TEST_EXTERNAL="1",
        RECEIVER_TEST_RECONCILE=reconcile,
    )
    body = body_of("payment.created", payment="p-1")
    headers = signed(f"msg_external_{reconcile}", body)
    wid = headers["webhook-id"]

    dead = crash(env, tmp_path / "crashed.log", "before_commit", body, headers)
    assert executions(invocations, wid) == [(1, dead)]

    with running(env, tmp_path / "fresh.log") as fresh:
        lease_until = await assert_in_flight(fresh, store_url, body, headers)
        wait_out(lease_until)
        recovered = post(fresh, body, headers)
        replayed = post(fresh, body, headers)
        fresh_pid = fresh.process.pid

    assert "idempotent-replayed" not in recovered.headers
    assert_replay(
        replayed, recovered.status_code, recovered.headers["content-type"], recovered.content
    )
    final = await receipt(store_url, wid)
    assert final["fence"] == 2, final
    assert final["body"] == recovered.content
    if reconcile == "none":
        # No way to ask the outside world: a final answer for the sender, a person looks at it.
        assert recovered.status_code == 202, (recovered.status_code, recovered.content)
        assert recovered.content.startswith(NEEDS_REVIEW_PREFIX), recovered.content
        assert final["state"] == "failed"
        assert executions(invocations, wid) == [(1, dead)], "re-ran an external handler blindly"
    elif reconcile == "done":
        assert (recovered.status_code, recovered.content) == (200, b'{"reconciled":true}')
        assert final["state"] == "completed"
        assert executions(invocations, wid) == [(1, dead)], "reconciled, yet ran again"
    else:
        expected = orjson.dumps({"payment": "p-1", "fence": 2})
        assert (recovered.status_code, recovered.content) == (200, expected)
        assert final["state"] == "completed"
        assert executions(invocations, wid) == [(1, dead), (2, fresh_pid)]
