"""T7, the database goes away and comes back under a running server (PostgreSQL).

A throwaway cluster (tests/pgcluster.py) backs one real ``receiver serve`` process. While the
database is down every delivery is answered 503 with Retry-After and no handler runs (no
handler runs without a claim, I1); nothing acknowledged before the outage is lost (I4). When
the database is back, the same process (same pid, no restart) reconnects and the deliveries
refused during the outage complete exactly once, then replay. And when the database is killed
mid-load (immediate shutdown while handlers run), every delivery still commits exactly once in
the end, every 200 given is kept, and nothing stays in flight.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest

from receiver import PostgresStore, StoreUnavailable
from tests import pgcluster
from tests.servers import running
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, signed

pytestmark = pytest.mark.slow

BEFORE = 5  # deliveries acknowledged before the outage
DURING = 8  # deliveries refused during the outage, completed after it
RECONNECT_WITHIN = 20.0  # seconds the pool may take to reconnect after the restart
# Idle keep-alive connections are dropped well before uvicorn's 5 s keep-alive timeout, so that
# the client never reuses one the server is closing (a client-side race, not the receiver's).
LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=1.0)


@pytest.fixture(scope="module")
def throwaway() -> Iterator[pgcluster.Cluster]:
    """One throwaway cluster for this module: the tests stop and start it at will."""
    try:
        started = pgcluster.start_cluster()
    except (RuntimeError, subprocess.SubprocessError, OSError, KeyError) as exc:
        pytest.fail(f"T7 needs a throwaway PostgreSQL cluster and none could be started: {exc}")
    try:
        yield started
    finally:
        started.destroy()


@pytest.fixture
def cluster(throwaway: pgcluster.Cluster) -> pgcluster.Cluster:
    """The throwaway cluster, running (whatever the previous test left), for the test to
    stop and start."""
    if not pgcluster.can_connect(throwaway.url):
        throwaway.start()
    return throwaway


@pytest.fixture
def database(cluster: pgcluster.Cluster, request: pytest.FixtureRequest) -> str:
    """A new database of the throwaway cluster with the ledger's schema and the effects table."""

    async def create() -> str:
        url = await pgcluster.recreate_database(
            cluster.url, f"outage_{request.node.name.removeprefix('test_')[:40]}"
        )
        async with PostgresStore(url) as store:
            await store.migrate()
            async with store.acquire() as conn:
                await conn.execute(EFFECTS_DDL)
        return url

    return asyncio.run(create())


def delivery(name: str) -> tuple[bytes, dict[str, str]]:
    body = body_of(order=f"o-{name}")
    return body, signed(f"msg_outage_{name}", body)


def executions(path: Path) -> collections.Counter[str]:
    if not path.exists():
        return collections.Counter()
    return collections.Counter(line.split()[0] for line in path.read_text().splitlines())


def is_replay(answer: httpx.Response) -> bool:
    return answer.headers.get("idempotent-replayed") == "true"


async def test_database_outage_and_recovery(
    cluster: pgcluster.Cluster, database: str, tmp_path: Path
) -> None:
    invocations = tmp_path / "invocations"
    env = {
        "RECEIVER_STORE": database,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        "RECEIVER_TEST_CRASH": "",
        "RECEIVER_TEST_SLOW": "0",
        "RECEIVER_TEST_EXTERNAL": "",
    }
    before = [delivery(f"before_{i}") for i in range(BEFORE)]
    during = [delivery(f"during_{i}") for i in range(DURING)]

    with running(env, tmp_path / "server.log") as server:
        pid = server.process.pid
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=LIMITS) as client:

            async def post(body: bytes, headers: dict[str, str]) -> httpx.Response:
                return await client.post(f"/{PROVIDER}", content=body, headers=headers)

            async def post_all(
                deliveries: list[tuple[bytes, dict[str, str]]],
            ) -> list[httpx.Response]:
                return list(await asyncio.gather(*(post(b, h) for b, h in deliveries)))

            # 1. The database is up: every delivery is executed and acknowledged.
            acknowledged = await post_all(before)
            for answer in acknowledged:
                assert (answer.status_code, is_replay(answer)) == (200, False), answer.content

            # 2. The database goes away: 503 + Retry-After, and no handler runs.
            cluster.stop()
            refused = await post_all(during)
            for answer in refused:
                assert answer.status_code == 503, (answer.status_code, answer.content)
                assert int(answer.headers["retry-after"]) >= 1, answer.headers
                assert orjson.loads(answer.content)["error"] == "store_unavailable"
            assert executions(invocations) == collections.Counter(
                h["webhook-id"] for _, h in before
            ), "a handler ran while the store was unavailable"

            # 3. The database comes back on the same port; the same server process recovers.
            cluster.start()
            first_body, first_headers = during[0]
            deadline = time.monotonic() + RECONNECT_WITHIN
            answer = await post(first_body, first_headers)
            while answer.status_code == 503 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                answer = await post(first_body, first_headers)
            assert answer.status_code == 200, (
                f"not recovered {RECONNECT_WITHIN} s after the database came back: "
                f"{answer.status_code} {answer.content!r}\n{server.output()}"
            )
            completed = [answer, *await post_all(during[1:])]
            for (body, _), answer in zip(during, completed, strict=True):
                assert (answer.status_code, is_replay(answer)) == (200, False), answer.content
                order = orjson.loads(body)["data"]["order"]
                assert answer.content == orjson.dumps({"order": order, "fence": 1})

            # 4. Everything, acknowledged before or after the outage, is now a replay.
            replays = await post_all(before + during)
            for answer, first in zip(replays, acknowledged + completed, strict=True):
                assert is_replay(answer), (answer.status_code, answer.headers, answer.content)
                assert (answer.status_code, answer.headers["content-type"], answer.content) == (
                    first.status_code,
                    first.headers["content-type"],
                    first.content,
                )

        assert server.process.poll() is None, f"the server died:\n{server.output()}"
        assert server.process.pid == pid

    ids = [h["webhook-id"] for _, h in before + during]
    assert executions(invocations) == collections.Counter(ids), "not exactly once per delivery"
    pids = {line.split()[2] for line in invocations.read_text().splitlines()}
    assert pids == {str(pid)}, f"every execution must come from the one server process: {pids}"

    conn = await asyncpg.connect(database, timeout=10)
    try:
        rows = await conn.fetch("SELECT webhook_id, count(*) AS n FROM effects GROUP BY 1")
        states = await conn.fetch("SELECT state, count(*) AS n FROM receiver_receipts GROUP BY 1")
    finally:
        await conn.close()
    assert {r["webhook_id"]: r["n"] for r in rows} == dict.fromkeys(ids, 1)
    assert {r["state"]: r["n"] for r in states} == {"completed": len(ids)}


MID_LOAD = 40  # deliveries streamed while the database is killed
STAGGER = 0.025  # seconds between their starts
LOAD_LEASE = 2  # seconds: the claims of attempts killed with the database expire quickly


async def test_database_killed_mid_load(
    cluster: pgcluster.Cluster, database: str, tmp_path: Path
) -> None:
    """The database is killed (immediate shutdown) while handlers are running. Attempts that
    die with it leave a committed in-flight claim; after the restart and the lease they run
    again under the next fence. In the end every delivery committed exactly once, and every
    200 given during the load is replayed byte for byte (nothing acknowledged is lost)."""
    invocations = tmp_path / "invocations"
    env = {
        "RECEIVER_STORE": database,
        "RECEIVER_SECRET": SECRET,
        "RECEIVER_TEST_INVOCATIONS": str(invocations),
        "RECEIVER_TEST_CRASH": "",
        "RECEIVER_TEST_SLOW": "0.2",  # handlers are mid-transaction when the database dies
        "RECEIVER_TEST_LEASE": str(LOAD_LEASE),
        "RECEIVER_TEST_EXTERNAL": "",
    }
    load = [delivery(f"load_{i:02d}") for i in range(MID_LOAD)]
    late = [delivery(f"late_{i}") for i in range(3)]
    ids = [h["webhook-id"] for _, h in load + late]

    with running(env, tmp_path / "server.log") as server:
        pid = server.process.pid
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=LIMITS) as client:

            async def post(body: bytes, headers: dict[str, str]) -> httpx.Response:
                return await client.post(f"/{PROVIDER}", content=body, headers=headers)

            first_answered = asyncio.Event()

            async def staggered(i: int) -> httpx.Response:
                await asyncio.sleep(i * STAGGER)
                body, headers = load[i]
                answer = await post(body, headers)
                first_answered.set()
                return answer

            async def kill_database() -> list[httpx.Response]:
                await asyncio.wait_for(first_answered.wait(), timeout=10)
                await asyncio.to_thread(cluster.stop, "immediate")
                # Deliveries that certainly arrive while the database is gone.
                return [await post(b, h) for b, h in late]

            *during, after_kill = await asyncio.wait_for(
                asyncio.gather(*(staggered(i) for i in range(MID_LOAD)), kill_database()),
                timeout=60,
            )
            first_answers = [*during, *after_kill]
            statuses = collections.Counter(a.status_code for a in first_answers)
            assert set(statuses) <= {200, 503}, (
                f"the database going away must be answered 503, never anything else: {statuses}"
                f"\n{[a.content for a in first_answers if a.status_code not in (200, 503)]}"
                f"\n{server.output()}"
            )
            assert statuses[200] >= 1, statuses
            assert statuses[503] >= len(late), statuses
            for answer in first_answers:
                if answer.status_code == 503:
                    assert int(answer.headers["retry-after"]) >= 1, answer.headers

            # The database comes back. Redeliver everything until it is complete: 503 while
            # the pool reconnects, 409 while a killed attempt's lease is live.
            cluster.start()
            deadline = time.monotonic() + LOAD_LEASE + RECONNECT_WITHIN
            final: dict[str, httpx.Response] = {}
            seen: collections.Counter[int] = collections.Counter()
            while len(final) < len(ids) and time.monotonic() < deadline:
                pending = [(b, h) for b, h in load + late if h["webhook-id"] not in final]
                for (_, headers), answer in zip(
                    pending, await asyncio.gather(*(post(b, h) for b, h in pending)), strict=True
                ):
                    seen[answer.status_code] += 1
                    if answer.status_code == 200:
                        final[headers["webhook-id"]] = answer
                    else:
                        assert answer.status_code in (409, 503), (
                            answer.status_code,
                            answer.content,
                        )
                if len(final) < len(ids):
                    await asyncio.sleep(0.25)
            assert len(final) == len(ids), (
                f"{len(ids) - len(final)} deliveries not complete {LOAD_LEASE + RECONNECT_WITHIN}"
                f" s after the database came back; answers seen: {seen}\n{server.output()}"
            )

        assert server.process.poll() is None, f"the server died:\n{server.output()}"
        assert server.process.pid == pid

    # Nothing acknowledged is lost: each 200 of the load is what every later copy replays.
    for (_, headers), answer in zip(load + late, first_answers, strict=True):
        if answer.status_code == 200:
            again = final[headers["webhook-id"]]
            assert is_replay(again), (headers["webhook-id"], again.headers)
            assert (again.headers["content-type"], again.content) == (
                answer.headers["content-type"],
                answer.content,
            )

    conn = await asyncpg.connect(database, timeout=10)
    try:
        effects = await conn.fetch("SELECT webhook_id, fence FROM effects")
        receipts = await conn.fetch("SELECT webhook_id, state, fence FROM receiver_receipts")
    finally:
        await conn.close()
    committed = collections.Counter(r["webhook_id"] for r in effects)
    assert committed == collections.Counter(ids), "every delivery must commit exactly once"
    assert {r["webhook_id"]: (r["state"], r["fence"]) for r in receipts} == {
        r["webhook_id"]: ("completed", r["fence"]) for r in effects
    }, "each receipt is completed under the fence of its one committed effects row"
    runs = executions(invocations)
    assert set(runs) == set(ids)
    for wid, answer in final.items():
        fence = orjson.loads(answer.content)["fence"]
        # At most one execution per fence, or two where the attempt shared a group transaction
        # that the dying database broke: each member of such a group runs again on its own
        # under the same fence (docs/how-to/handlers.md), its first run rolled back. (An
        # attempt may also die before its handler starts.) What committed is checked above.
        assert 1 <= runs[wid] <= 2 * fence, (wid, runs[wid], fence)
    assert {line.split()[2] for line in invocations.read_text().splitlines()} == {str(pid)}


KILL_ROUNDS = 5  # each round reproduces the release race below with a good probability
WORKERS = 100


async def test_the_store_reports_a_dying_database_as_unavailable(
    cluster: pgcluster.Cluster, database: str
) -> None:
    """The store seam itself, in-process: many deliveries' worth of acquire/query/release while
    the database is killed. Every failure must surface as StoreUnavailable (which the pipeline
    answers 503), never as a raw driver error (which escapes as a 500)."""
    escaped: collections.Counter[str] = collections.Counter()
    for _ in range(KILL_ROUNDS):
        stop = asyncio.Event()
        async with PostgresStore(database, max_size=20) as store:

            async def work(store: PostgresStore = store, stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        async with store.acquire() as conn:
                            await conn.execute("SELECT 1")
                    except StoreUnavailable:
                        await asyncio.sleep(0.01)
                    except Exception as exc:
                        escaped[f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"] += 1

            workers = [asyncio.create_task(work()) for _ in range(WORKERS)]
            try:
                await asyncio.sleep(0.3)
                await asyncio.to_thread(cluster.stop, "immediate")
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(*workers), timeout=30)
        cluster.start()
        if escaped:
            break
    assert not escaped, (
        "LIBRARY BUG (receiver/_store/postgres.py, PostgresStore._release): when the connection is "
        "lost while it is being released, asyncpg's Pool.release raises InternalClientError "
        "('release() called on a free connection holder'); the fallback conn.terminate() then "
        "raises InterfaceError ('connection has been released back to the pool'), which escapes "
        "Store.acquire() as a raw driver error: the pipeline does not catch it and the sender "
        f"gets a 500 'Internal Server Error' instead of a 503. Escaped: {dict(escaped)}"
    )


async def test_a_server_started_while_the_database_is_down_serves_once_it_is_back(
    cluster: pgcluster.Cluster, database: str, tmp_path: Path
) -> None:
    """``receiver serve`` of the default app, whose startup hook creates its tables, started
    during an outage (an orchestrator restarting it): it does not exit; it answers 503 with
    Retry-After until the database answers and the hook has run, then executes once."""
    cluster.stop()
    log = tmp_path / "server.log"
    env = {"RECEIVER_STORE": database, "RECEIVER_SECRET": SECRET}
    body = body_of(order_id="o-late", customer="c", amount_cents=100)
    headers = signed("msg_started_in_outage", body)
    with running(env, log, app="handlers:app") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            refused = await client.post("/demo", content=body, headers=headers)
            assert refused.status_code == 503, refused.content
            assert refused.headers["retry-after"].isdigit()
            await asyncio.sleep(0.5)
            assert server.process.poll() is None, server.output()
            cluster.start()
            deadline = time.monotonic() + RECONNECT_WITHIN
            while (
                answer := await client.post("/demo", content=body, headers=headers)
            ).status_code == 503:
                assert time.monotonic() < deadline, server.output()
                await asyncio.sleep(0.2)
            assert (answer.status_code, is_replay(answer)) == (200, False), answer.content
            again = await client.post("/demo", content=body, headers=headers)
            assert (again.status_code, again.content, is_replay(again)) == (
                200,
                answer.content,
                True,
            )
    assert "startup hooks could not run" in log.read_text()
    conn = await asyncpg.connect(database)
    try:
        rows = await conn.fetch("SELECT id, updated_by FROM orders")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [("o-late", "msg_started_in_outage")]
