"""T3, crash: a real ``receiver serve`` process SIGKILLs itself at a hook point, then other
processes on the same store get the redeliveries. Never two committed executions.

- before_commit: the handler wrote through ``tx`` and the process died before the commit. The
  committed in-flight claim keeps the key: a redelivery within the lease is 409 (Retry-After);
  after the lease it is reclaimed under fence 2 and runs once more; one effects row in the end.
- after_commit: the receipt committed and the process died before answering. The redelivery is
  a byte-identical replay of the stored answer; the handler ran once.
- external handlers (``effects="external"``) are never re-run blindly after such a crash: without
  ``reconcile`` the receipt is marked failed (202 needs_review); ``reconcile`` decides otherwise.

Two kinds of survivor take the redeliveries, neither with the crash hook: a *standby* replica
started before the crash (so that the 409 within the lease is observed whatever the machine's
load: it answers milliseconds after the death) and a *fresh* process started after the death,
which knows nothing but what the store holds and performs the recovery.

Every case runs on PostgreSQL and on a SQLite file; the transactional ones also behind a real
PgBouncer in transaction mode (issue 20: the servers' store URL names the pooler with
``?pooler=transaction``, the test reads the ledger directly). The pooler holds a dead client's
server session in a transaction until it notices; the claim still decides. The test app
(tests/apps/server.py) appends "<id> <fence> <pid>" to the invocations file on every true
execution, committed or not.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import POOLED_DATABASE, truncate
from tests.servers import Server, start_server
from tests.support import PROVIDER, SECRET, body_of, query, signed

pytestmark = pytest.mark.slow

LEASE = 2  # seconds: the dead attempt's claim; the tests wait it out
NEEDS_REVIEW_PREFIX = b'{"status":"needs_review"'
RECONCILE_MODES = ("none", "done", "again")

Headers = dict[str, str]


# -- helpers ------------------------------------------------------------------------------------


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
    """A server without any crash hook (explicitly: the variables may be set outside)."""
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


def crashing(env: Mapping[str, str], hook: str, webhook_id: str) -> dict[str, str]:
    return {**env, "RECEIVER_TEST_CRASH": hook, "RECEIVER_TEST_CRASH_IDS": webhook_id}


def start_all(stack: ExitStack, specs: list[tuple[Mapping[str, str], Path]]) -> list[Server]:
    """Start several servers at once; each is stopped (or killed) when ``stack`` closes."""
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = [pool.submit(start_server, env, log) for env, log in specs]
        servers: list[Server] = []
        failures: list[BaseException] = []
        for future in futures:
            try:
                servers.append(future.result(timeout=60))
            except Exception as exc:
                failures.append(exc)
    for server in servers:
        stack.callback(server.stop)
    if failures:
        raise failures[0]
    return servers


def post(server: Server, body: bytes, headers: Headers) -> httpx.Response:
    return httpx.post(f"{server.url}/{PROVIDER}", content=body, headers=headers, timeout=15)


def die(server: Server, hook: str, body: bytes, headers: Headers) -> int:
    """Deliver to a server that SIGKILLs itself at ``hook``: the client sees the connection
    drop and the process is dead. Returns its pid."""
    try:
        answer = post(server, body, headers)
    except httpx.TransportError:
        pass  # the connection dropped: the process died
    else:
        pytest.fail(f"the {hook} hook did not kill the server: {answer.status_code}")
    code = server.process.wait(timeout=10)
    assert code == -signal.SIGKILL, f"server exited with {code}:\n{server.output()}"
    return server.process.pid


def assert_replay(answer: httpx.Response, status: int, content_type: str, body: bytes) -> None:
    assert answer.headers.get("idempotent-replayed") == "true", (answer.headers, answer.content)
    assert (answer.status_code, answer.headers["content-type"], answer.content) == (
        status,
        content_type,
        body,
    )


def assert_fresh(answer: httpx.Response, status: int, body: bytes) -> None:
    assert "idempotent-replayed" not in answer.headers, (answer.headers, answer.content)
    assert (answer.status_code, answer.content) == (status, body)


def redeliver(server: Server, body: bytes, headers: Headers) -> tuple[httpx.Response, float]:
    """A redelivery, and the time by which the server had decided it."""
    answer = post(server, body, headers)
    return answer, time.time()


async def assert_in_flight(
    url: str, headers: Headers, redelivered: tuple[httpx.Response, float]
) -> float:
    """A redelivery decided within the dead attempt's lease is 409 with Retry-After (and runs
    nothing); returns the lease's end, so that the caller can wait it out."""
    answer, answered_at = redelivered
    lease_until = (await receipt(url, headers["webhook-id"]))["lease_until"]
    assert answered_at < lease_until, "the lease expired before the redelivery: raise LEASE"
    assert answer.status_code == 409, (answer.status_code, answer.content)
    assert 1 <= int(answer.headers["retry-after"]) <= LEASE, answer.headers
    return lease_until


def wait_out(lease_until: float) -> None:
    time.sleep(max(0.0, lease_until - time.time()) + 0.2)


# -- transactional handlers -----------------------------------------------------------------------


@pytest.fixture(params=["postgresql", "sqlite", "pgbouncer"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(the servers' store URL, the URL the test reads the ledger with): one URL, except
    behind the pooler, where the servers go through PgBouncer and the test reads directly."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/r.db"
        return url, url
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
        asyncio.run(truncate(url))
        return url, url
    direct: str = request.getfixturevalue("pooled_database")
    asyncio.run(truncate(direct))
    pooler = request.getfixturevalue("pgbouncers")["transaction"]
    return pooler.url(POOLED_DATABASE) + "?pooler=transaction", direct


async def test_crash_before_commit_runs_again_after_the_lease(
    served: tuple[str, str], tmp_path: Path
) -> None:
    through, store_url = served
    invocations = tmp_path / "invocations"
    env = server_env(through, invocations)
    body = body_of(order="o-before")
    headers = signed("msg_crash_before", body)
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
        assert executions(invocations, wid) == [(1, dead)]
        held = await receipt(store_url, wid)
        assert (held["state"], held["fence"], held["status"]) == ("in_flight", 1, None), held
        assert await effect_fences(store_url, wid) == [], "the dead attempt's write must roll back"

        lease_until = await assert_in_flight(store_url, headers, redeliver(standby, body, headers))
        assert executions(invocations, wid) == [(1, dead)], "a 409 must not run the handler"

        (fresh,) = start_all(stack, [(env, tmp_path / "fresh.log")])  # after the death
        wait_out(lease_until)
        again = post(fresh, body, headers)
        assert_fresh(again, 200, orjson.dumps({"order": "o-before", "fence": 2}))
        for survivor in (fresh, standby):
            assert_replay(
                post(survivor, body, headers), 200, again.headers["content-type"], again.content
            )

    assert executions(invocations, wid) == [(1, dead), (2, fresh.process.pid)]
    assert await effect_fences(store_url, wid) == [2]
    done = await receipt(store_url, wid)
    assert (done["state"], done["fence"], done["body"]) == ("completed", 2, again.content)


async def test_crash_after_commit_replays_the_stored_answer(
    served: tuple[str, str], tmp_path: Path
) -> None:
    through, store_url = served
    invocations = tmp_path / "invocations"
    env = server_env(through, invocations)
    body = body_of(order="o-after")
    headers = signed("msg_crash_after", body)
    wid = headers["webhook-id"]

    with ExitStack() as stack:
        (victim,) = start_all(stack, [(crashing(env, "after_commit", wid), tmp_path / "v.log")])
        dead = die(victim, "after_commit", body, headers)
        stored = await receipt(store_url, wid)
        # What the fence-1 handler returned, committed although the sender never got it.
        expected = orjson.dumps({"order": "o-after", "fence": 1})
        assert (stored["state"], stored["fence"], stored["status"], stored["body"]) == (
            "completed",
            1,
            200,
            expected,
        ), stored
        assert stored["content_type"] == "application/json"

        (fresh,) = start_all(stack, [(env, tmp_path / "fresh.log")])  # after the death
        answers = [post(fresh, body, headers) for _ in range(2)]
    for answer in answers:
        assert_replay(answer, stored["status"], stored["content_type"], stored["body"])

    assert executions(invocations, wid) == [(1, dead)]
    assert await effect_fences(store_url, wid) == [1]


# -- external handlers --------------------------------------------------------------------------


async def test_crash_of_an_external_handler_is_never_rerun_blindly(
    store_url: str, tmp_path: Path
) -> None:
    """One delivery per reconcile mode, side by side (one lease to wait out, not three): each
    kills its own server before commit; after the lease a fresh server with that reconcile mode
    gets the redelivery."""
    invocations = tmp_path / "invocations"
    body = body_of("payment.created", payment="p-1")
    cases = {mode: signed(f"msg_external_{mode}", body) for mode in RECONCILE_MODES}
    envs = {
        mode: server_env(
            store_url, invocations, RECEIVER_TEST_EXTERNAL="1", RECEIVER_TEST_RECONCILE=mode
        )
        for mode in RECONCILE_MODES
    }

    with ExitStack() as stack:
        *victims, standby = start_all(
            stack,
            [
                *(
                    (crashing(envs[m], "before_commit", cases[m]["webhook-id"]), tmp_path / m)
                    for m in RECONCILE_MODES
                ),
                (envs["none"], tmp_path / "standby.log"),
            ],
        )

        def kill_then_redeliver(
            victim: Server, mode: str
        ) -> tuple[int, tuple[httpx.Response, float]]:
            dead = die(victim, "before_commit", body, cases[mode])
            return dead, redeliver(standby, body, cases[mode])  # at once, within the lease

        with ThreadPoolExecutor(len(victims)) as pool:
            outcomes = dict(
                zip(
                    RECONCILE_MODES,
                    pool.map(kill_then_redeliver, victims, RECONCILE_MODES),
                    strict=True,
                )
            )
        dead = {m: pid for m, (pid, _) in outcomes.items()}
        leases = [
            await assert_in_flight(store_url, cases[m], outcomes[m][1]) for m in RECONCILE_MODES
        ]
        for mode, headers in cases.items():
            assert executions(invocations, headers["webhook-id"]) == [(1, dead[mode])]

        started = start_all(stack, [(envs[m], tmp_path / f"fresh-{m}") for m in RECONCILE_MODES])
        fresh = dict(zip(RECONCILE_MODES, started, strict=True))
        wait_out(max(leases))
        recovered = {m: post(fresh[m], body, cases[m]) for m in RECONCILE_MODES}
        replayed = {m: post(fresh[m], body, cases[m]) for m in RECONCILE_MODES}

    for mode in RECONCILE_MODES:
        wid = cases[mode]["webhook-id"]
        answer = recovered[mode]
        assert "idempotent-replayed" not in answer.headers, (mode, answer.headers)
        assert_replay(
            replayed[mode], answer.status_code, answer.headers["content-type"], answer.content
        )
        final = await receipt(store_url, wid)
        assert (final["fence"], final["body"]) == (2, answer.content), (mode, final)
        ran = executions(invocations, wid)
        if mode == "none":
            # No way to ask the outside world: a final answer for the sender, a person looks.
            assert answer.status_code == 202, (answer.status_code, answer.content)
            assert answer.content.startswith(NEEDS_REVIEW_PREFIX), answer.content
            assert final["state"] == "failed"
            assert ran == [(1, dead[mode])], "re-ran an external handler blindly"
        elif mode == "done":
            assert (answer.status_code, answer.content) == (200, b'{"reconciled":true}')
            assert final["state"] == "completed"
            assert ran == [(1, dead[mode])], "reconciled as done, yet ran again"
        else:
            expected = orjson.dumps({"payment": "p-1", "fence": 2})
            assert (answer.status_code, answer.content) == (200, expected)
            assert final["state"] == "completed"
            assert ran == [(1, dead[mode]), (2, fresh[mode].process.pid)]
