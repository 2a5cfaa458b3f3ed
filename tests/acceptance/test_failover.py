"""Across a failover: the primary dies, its streaming standby is promoted, and the store URL
names both hosts with ``target_session_attrs=read-write`` (tests/pgreplica.py builds the pair
from the installed binaries on loopback ports).

A 2xx means the receipt and the handler's writes committed. With synchronous replication the
standby had every such commit before the 2xx left, so the promoted standby loses nothing
acknowledged and nothing runs twice: proven under load for the webhook path, the executor and
the Idempotency-Key middleware, and the queued workers. With asynchronous replication an
acknowledged delivery can be lost: the boundary is shown too, with the standby held back so
that the loss is certain rather than a matter of timing.

Each test prints one ``FAILOVER`` line with its figures (``pytest -s``); docs/how-to/postgresql.md's
"Failover" section quotes them.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from receiver import (
    RUN_AGAIN,
    ActionInProgress,
    Actions,
    Connection,
    IdempotencyKeyMiddleware,
    PostgresStore,
    StoreUnavailable,
    ToolCall,
    idempotent_request,
)
from receiver._ledger.results import RunAgain
from tests import pgcluster, pgreplica
from tests.acceptance.test_outage import is_replay
from tests.acceptance.test_queued_workers import QUEUED, effects_by_id, executions, stop
from tests.acceptance.test_queued_workers import env_for as queued_env_for
from tests.servers import running, start_worker
from tests.support import EFFECTS_DDL, PROVIDER, body_of, signed

pytestmark = pytest.mark.slow

DATABASE = "failover"
LEASE = 2  # seconds: claims cut by the failover are taken over soon after it
RECOVER_WITHIN = 30.0  # seconds after the promotion for everything to be complete
LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=1.0)


@pytest.fixture
def synchronous() -> Iterator[pgreplica.Replicated]:
    yield from _pair(synchronous=True)


@pytest.fixture
def asynchronous() -> Iterator[pgreplica.Replicated]:
    yield from _pair(synchronous=False)


def _pair(*, synchronous: bool) -> Iterator[pgreplica.Replicated]:
    try:
        pair = pgreplica.replicated(synchronous=synchronous)
    except Exception as exc:
        pytest.fail(f"the failover tests need a primary and a standby and none started: {exc}")
    try:
        asyncio.run(_prepare(pair))
        yield pair
    finally:
        pair.destroy()


async def _prepare(pair: pgreplica.Replicated) -> None:
    await pgcluster.recreate_database(pair.primary.url, DATABASE)
    async with PostgresStore(pair.url(DATABASE)) as store:
        await store.migrate()
        async with store.acquire() as conn:
            await conn.execute(EFFECTS_DDL)
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS business (key TEXT NOT NULL, fence INTEGER NOT NULL)"
            )


def env_for(pair: pgreplica.Replicated, invocations: Path, **extra: str) -> dict[str, str]:
    return queued_env_for(pair.url(DATABASE), invocations, RECEIVER_TEST_LEASE=str(LEASE), **extra)


async def fetch(url: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()


async def committed(url: str) -> collections.Counter[str]:
    """Business rows per webhook-id on the server ``url`` names."""
    return collections.Counter({w: len(fences) for w, fences in (await effects_by_id(url)).items()})


async def receipt_states(url: str) -> dict[str, str]:
    rows = await fetch(url, "SELECT webhook_id, state FROM receiver_receipts")
    return {r["webhook_id"]: r["state"] for r in rows}


class Sender:
    """Signed deliveries of one webhook-id each, to a running receiver."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def __call__(self, webhook_id: str) -> httpx.Response:
        body = body_of(order=webhook_id)
        return await self.client.post(
            f"/{PROVIDER}", content=body, headers=signed(webhook_id, body)
        )

    async def until_final(
        self, ids: list[str], *, final: int = 200, within: float = LEASE + RECOVER_WITHIN
    ) -> dict[str, httpx.Response]:
        """Redeliver every id, as senders do, until each gets its final answer: 503 while the
        pool finds the new primary, 409 while a cut attempt's lease is live."""
        deadline = time.monotonic() + within
        answers: dict[str, httpx.Response] = {}
        seen: collections.Counter[int] = collections.Counter()
        while len(answers) < len(ids):
            pending = [w for w in ids if w not in answers]
            for webhook_id, answer in zip(
                pending, await asyncio.gather(*(self(w) for w in pending)), strict=True
            ):
                seen[answer.status_code] += 1
                if answer.status_code == final:
                    answers[webhook_id] = answer
                else:
                    assert answer.status_code in (409, 503), (answer.status_code, answer.content)
            if len(answers) < len(ids):
                assert time.monotonic() < deadline, (
                    f"{len(ids) - len(answers)} deliveries not complete {within} s after the "
                    f"failover; answers seen: {seen}"
                )
                await asyncio.sleep(0.25)
        return answers


def assert_unavailable(answer: httpx.Response) -> None:
    assert answer.status_code == 503, (answer.status_code, answer.content)
    assert int(answer.headers["retry-after"]) >= 1, answer.headers
    assert orjson.loads(answer.content)["error"] == "store_unavailable"


FRESH = 60  # fresh deliveries streamed across the failover
STAGGER = 0.02  # seconds between their starts
REDELIVER_AFTER = 5  # each is redelivered alongside the delivery this many places later
KILL_AFTER = 20  # deliveries acknowledged before the primary dies
GAP = 3  # deliveries that certainly arrive while there is no primary


async def test_synchronous_failover_under_load_loses_nothing_and_runs_nothing_twice(
    synchronous: pgreplica.Replicated, tmp_path: Path
) -> None:
    pair = synchronous
    invocations = tmp_path / "invocations"
    # Handlers are mid-transaction when the primary dies.
    env = env_for(pair, invocations, RECEIVER_TEST_SLOW="0.1")
    fresh = [f"load_{i:03d}" for i in range(FRESH)]
    gap = [f"gap_{i}" for i in range(GAP)]
    answers: list[tuple[str, httpx.Response]] = []

    with running(env, tmp_path / "server.log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=LIMITS) as client:
            send = Sender(client)
            enough = asyncio.Event()

            async def deliver(webhook_id: str, delay: float) -> None:
                await asyncio.sleep(delay)
                answers.append((webhook_id, await send(webhook_id)))
                # Distinct ids: a redelivery's replayed 200 acknowledges nothing new.
                if len({w for w, a in answers if a.status_code == 200}) >= KILL_AFTER:
                    enough.set()

            async def fail_over() -> list[httpx.Response]:
                await asyncio.wait_for(enough.wait(), timeout=30)
                await asyncio.to_thread(pair.kill_primary)
                await asyncio.sleep(0.3)  # the attempts the kill cut have ended
                ran = sum(executions(invocations).values())
                refused = list(await asyncio.gather(*(send(w) for w in gap)))
                await asyncio.sleep(0.5)
                assert sum(executions(invocations).values()) == ran, (
                    "a handler ran while there was no primary"
                )
                await asyncio.to_thread(pair.promote)
                return refused

            schedule = [(w, i * STAGGER) for i, w in enumerate(fresh)] + [
                (fresh[i - REDELIVER_AFTER], i * STAGGER) for i in range(REDELIVER_AFTER, FRESH)
            ]
            *_, refused = await asyncio.wait_for(
                asyncio.gather(*(deliver(w, d) for w, d in schedule), fail_over()), timeout=90
            )
            for answer in refused:
                assert_unavailable(answer)
            statuses = collections.Counter(a.status_code for _, a in answers)
            assert set(statuses) <= {200, 409, 503}, (statuses, server.output())
            for _, answer in answers:
                if answer.status_code == 503:
                    assert_unavailable(answer)
            final = await send.until_final(fresh + gap)
        assert server.process.poll() is None, f"the server died:\n{server.output()}"

    acknowledged: dict[str, httpx.Response] = {}
    for webhook_id, answer in answers:
        if answer.status_code == 200:
            acknowledged.setdefault(webhook_id, answer)
    assert len(acknowledged) >= KILL_AFTER, statuses
    lost = [
        w
        for w, first in acknowledged.items()
        if not is_replay(final[w]) or final[w].content != first.content
    ]
    assert lost == [], f"acknowledged, then lost in the failover: {lost}"

    new_primary = pair.primary_url(DATABASE)
    rows = await committed(new_primary)
    twice = sorted(w for w, n in rows.items() if n > 1)
    assert twice == [], f"committed twice: {twice}"
    assert rows == collections.Counter(fresh + gap), "every delivery commits exactly once"
    states = await receipt_states(new_primary)
    assert set(states.values()) == {"completed"}, "nothing stays in flight after the leases"
    print(
        f"\nFAILOVER synchronous, webhooks: {len(fresh + gap)} deliveries, {len(acknowledged)}"
        f" acknowledged (200) while it failed over, {statuses[503] + len(refused)} answered 503"
        f" in the gap, lost {len(lost)}, committed twice {len(twice)}"
    )


HELD = 5  # deliveries acknowledged while the standby is behind


async def test_asynchronous_replication_loses_what_the_standby_never_got(
    asynchronous: pgreplica.Replicated, tmp_path: Path
) -> None:
    """The boundary: with asynchronous replication a commit is acknowledged before the standby
    has it. Deliveries answered 200 while the standby was behind are gone from the promoted
    standby; their redeliveries run the handlers a second time. What the standby had before
    it fell behind is kept."""
    pair = asynchronous
    invocations = tmp_path / "invocations"
    env = env_for(pair, invocations)
    kept = [f"kept_{i}" for i in range(HELD)]
    held = [f"held_{i}" for i in range(HELD)]

    with running(env, tmp_path / "server.log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=LIMITS) as client:
            send = Sender(client)
            first = {w: await send(w) for w in kept}
            await wait_replayed(pair, kept)
            # The standby falls behind: a partition, a slow disk, a replica restarting.
            await asyncio.to_thread(pair.standby.stop)
            first |= {w: await send(w) for w in held}
            assert {w: a.status_code for w, a in first.items()} == dict.fromkeys(kept + held, 200)
            await asyncio.to_thread(pair.kill_primary)
            await asyncio.to_thread(pair.standby.start)
            await asyncio.to_thread(pair.promote)

    # What the new primary holds is the truth: the receipts and business rows of the held
    # deliveries are gone, though each was answered 200 (and the sender will not resend it).
    new_primary = pair.primary_url(DATABASE)
    states = await receipt_states(new_primary)
    lost = [w for w in kept + held if w not in states]
    assert lost == held, "exactly what the standby never received is lost"
    assert await committed(new_primary) == collections.Counter(kept)
    print(
        f"\nFAILOVER asynchronous, standby behind: {len(first)} acknowledged, lost {len(lost)}"
        " (every one acknowledged after the standby fell behind)"
    )


async def wait_replayed(pair: pgreplica.Replicated, ids: list[str], within: float = 30) -> None:
    """Until the standby has replayed the business rows of ``ids``."""
    standby = pgcluster.with_database(pair.standby.url, DATABASE)
    deadline = time.monotonic() + within
    while not set(ids) <= set(await committed(standby)):
        assert time.monotonic() < deadline, "the standby did not catch up"
        await asyncio.sleep(0.1)


async def test_synchronous_replication_acknowledges_nothing_the_standby_lacks(
    synchronous: pgreplica.Replicated, tmp_path: Path
) -> None:
    """The same standby falling behind under synchronous replication: the commit waits for
    it, so no 2xx is given; the sender's retry after the failover runs the delivery once on
    the new primary, and nothing answered 200 is missing."""
    pair = synchronous
    invocations = tmp_path / "invocations"
    env = env_for(pair, invocations)

    with running(env, tmp_path / "server.log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=LIMITS) as client:
            send = Sender(client)
            kept = await send("kept")
            assert kept.status_code == 200
            await asyncio.to_thread(pair.standby.stop)
            waiting = asyncio.create_task(send("waiting"))
            done, _ = await asyncio.wait({waiting}, timeout=3)
            assert not done, "a commit the standby does not have was acknowledged"
            await asyncio.to_thread(pair.kill_primary)
            cut = await asyncio.wait_for(waiting, timeout=30)
            assert cut.status_code == 503, (cut.status_code, cut.content)
            await asyncio.to_thread(pair.standby.start)
            await asyncio.to_thread(pair.promote)
            final = await send.until_final(["kept", "waiting"])

    assert is_replay(final["kept"])
    assert final["kept"].content == kept.content
    assert not is_replay(final["waiting"])
    assert await committed(pair.primary_url(DATABASE)) == collections.Counter(["kept", "waiting"])
    print("\nFAILOVER synchronous, standby away: acknowledged while it was away 0, lost 0")


KEYS = 30  # action keys, and as many Idempotency-Key keys, taken across the failover


async def test_executor_and_middleware_keys_across_a_failover(
    synchronous: pgreplica.Replicated,
) -> None:
    """Agents and API clients retry through the failover (StoreUnavailable, 503, in progress)
    until each key has its answer: one business row per key, each external effect once (the
    cut attempts are reconciled, never re-run), and every later retry replays."""
    pair = synchronous
    store = PostgresStore(pair.url(DATABASE), max_size=20)
    actions = Actions(store, lease=LEASE, wait=0, sweep_interval=None)
    outside: collections.Counter[str] = collections.Counter()  # a payment API's own record

    @actions.tool("transfer")
    async def transfer(call: ToolCall, tx: Connection) -> dict[str, str]:
        await tx.execute(
            "INSERT INTO business (key, fence) VALUES ($1, $2)", call.action.key, call.fence
        )
        await asyncio.sleep(0.05)
        return {"transferred": call.request["ref"]}

    async def find_notice(call: ToolCall) -> dict[str, str] | RunAgain:
        # Asks the outside system, as a reconcile must: a claim can commit and then lose its
        # connection before the tool is called, and then nothing happened outside.
        if outside[call.downstream_key]:
            return {"notified": call.request["ref"]}
        return RUN_AGAIN

    @actions.tool("notify", effects="external", reconcile=find_notice)
    async def notify(call: ToolCall, tx: Connection) -> dict[str, str]:
        outside[call.downstream_key] += 1
        await asyncio.sleep(0.05)
        return {"notified": call.request["ref"]}

    async def pay(request: Request) -> JSONResponse:
        keyed = idempotent_request(request)
        assert keyed is not None
        key = request.headers["idempotency-key"]
        await keyed.tx.execute("INSERT INTO business (key, fence) VALUES ($1, 0)", f"idem:{key}")
        await asyncio.sleep(0.05)
        return JSONResponse({"paid": key}, 201)

    api = IdempotencyKeyMiddleware(
        Starlette(routes=[Route("/pay", pay, methods=["POST"])]),
        store=store,
        principal=lambda scope: "tenant-1",
        lease=LEASE,
        sweep_interval=None,
    )
    finished = 0
    enough = asyncio.Event()

    async def until_done(attempt: Callable[[], Awaitable[bytes | None]]) -> bytes:
        nonlocal finished
        deadline = time.monotonic() + 60
        while (body := await attempt()) is None:
            assert time.monotonic() < deadline, "a key never got its answer"
            await asyncio.sleep(0.2)
        finished += 1
        if finished >= KEYS:
            enough.set()
        return body

    def action(tool: str, i: int) -> Callable[[], Awaitable[bytes | None]]:
        proposed = actions.propose(tool, scope="tenant-1", action_id=f"a{i}", request={"ref": i})

        async def attempt() -> bytes | None:
            try:
                return (await actions.execute(proposed)).body
            except (StoreUnavailable, ActionInProgress):
                return None

        return attempt

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://api"
    ) as client:

        def request(i: int) -> Callable[[], Awaitable[bytes | None]]:
            async def attempt() -> bytes | None:
                answer = await client.post(
                    "/pay", json={"ref": i}, headers={"idempotency-key": f"k{i}"}
                )
                if answer.status_code in (409, 503):
                    return None
                assert answer.status_code == 201, (answer.status_code, answer.content)
                return answer.content

            return attempt

        async def staggered(i: int, attempt: Callable[[], Awaitable[bytes | None]]) -> bytes:
            await asyncio.sleep(i * 0.01)
            return await until_done(attempt)

        async def fail_over() -> None:
            await asyncio.wait_for(enough.wait(), timeout=30)
            await asyncio.to_thread(pair.kill_primary)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(pair.promote)

        attempts = [
            *(action("transfer", i) for i in range(KEYS)),
            *(action("notify", i) for i in range(KEYS)),
            *(request(i) for i in range(KEYS)),
        ]
        *firsts, _ = await asyncio.wait_for(
            asyncio.gather(*(staggered(i % KEYS, a) for i, a in enumerate(attempts)), fail_over()),
            timeout=120,
        )
        # Every retry from now on replays the first answer.
        agains = [await until_done(a) for a in attempts]
        assert agains == firsts
    await store.close()

    rows = await fetch(pair.primary_url(DATABASE), "SELECT key FROM business")
    per_key = collections.Counter(r["key"] for r in rows)
    assert len(per_key) == 2 * KEYS, per_key
    assert set(per_key.values()) == {1}, per_key
    assert len(outside) == KEYS, outside
    assert set(outside.values()) == {1}, outside
    print(
        f"\nFAILOVER synchronous, keys: {3 * KEYS} keys (executor transactional and external,"
        " middleware), each effect once"
    )


QUEUED_IDS = 30


async def test_a_failover_while_a_queued_worker_holds_claims(
    synchronous: pgreplica.Replicated, tmp_path: Path
) -> None:
    """Deliveries queued (202) before the failover, a worker process mid-way through them when
    the primary dies: the worker lives through it, finds the new primary, and every delivery
    commits exactly once there."""
    pair = synchronous
    invocations = tmp_path / "invocations"
    env = env_for(pair, invocations, RECEIVER_TEST_SLOW="0.2")
    ids = [f"queued_{i:02d}" for i in range(QUEUED_IDS)]
    log = tmp_path / "worker.log"
    with running(env, tmp_path / "server.log", app="tests.apps.queued:rx") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=LIMITS) as client:
            send = Sender(client)
            for answer in await asyncio.gather(*(send(w) for w in ids)):
                assert (answer.status_code, answer.content) == (202, QUEUED)
    worker = start_worker(env, log, concurrency=4)
    try:
        deadline = time.monotonic() + 30
        while sum(executions(invocations).values()) < 6:
            assert time.monotonic() < deadline, log.read_text()
            assert worker.poll() is None, log.read_text()
            await asyncio.sleep(0.05)
        await asyncio.to_thread(pair.fail_over)
        new_primary = pair.primary_url(DATABASE)
        deadline = time.monotonic() + LEASE + RECOVER_WITHIN
        while (states := await receipt_states(new_primary)) != dict.fromkeys(ids, "completed"):
            assert time.monotonic() < deadline, (
                collections.Counter(states.values()),
                log.read_text(),
            )
            await asyncio.sleep(0.2)
        assert worker.poll() is None, (
            f"the worker must live through the failover: {log.read_text()}"
        )
    finally:
        stop(worker)
    assert await committed(new_primary) == collections.Counter(ids)
    print(f"\nFAILOVER synchronous, queued: {len(ids)} acknowledged 202, lost 0, committed twice 0")
