"""The partitioned layout of a PostgreSQL ledger (receiver/_store/partitions.py), on a real
PostgreSQL: the conversion both ways keeps every receipt and what it answers; expiry drops a
partition and takes only what expiry would delete, moving the rest; the key stays unique across
partitions under concurrent claims; and redeliveries racing a drop never run a handler twice.

The conformance suite (the ``store`` fixture's ``partitioned`` parameter) runs the ledger's
other tests on this layout too."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receiver import PostgresStore, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._ops.sweeper import DEAD_LETTER_RETENTION
from receiver._store import partitions
from receiver._verification.payload import parse
from tests import pgcluster
from tests.conftest import prepared_database, truncate
from tests.support import PROVIDER, Clock, body_of, effects, make_receiver, signed

ROOT = Path(__file__).resolve().parents[2]
DAY = 24 * 3600.0


@pytest.fixture
def single_url(pg_admin_url: str) -> Iterator[str]:
    """A database of its own in the single layout, for the conversions."""
    name = f"receiver_test_layouts_{os.getpid()}"
    yield asyncio.run(prepared_database(pg_admin_url, name))
    asyncio.run(pgcluster.drop_database(pg_admin_url, name))


@pytest.fixture
async def parted(pg_partitioned_url: str) -> AsyncIterator[PostgresStore]:
    await truncate(pg_partitioned_url)
    async with PostgresStore(pg_partitioned_url, max_size=20) as store:
        yield store


async def deliver(rx: Receiver, webhook_id: str, clock: Clock, **data: Any) -> httpx.Response:
    body = body_of("order.created", **data)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=rx), base_url="http://test"
    ) as client:
        return await client.post(
            f"/{PROVIDER}", content=body, headers=signed(webhook_id, body, timestamp=clock.now)
        )


async def rows(store: Store, sql: str, *args: Any) -> list[Any]:
    async with store.acquire() as conn:
        return list(await conn.fetch(sql, *args))


async def consistent(store: Store) -> None:
    """Every receipt has its key, in its own partition's bucket, and every key its receipt."""
    stray = await rows(
        store,
        "SELECT k.webhook_id AS key, r.webhook_id AS receipt FROM receiver_receipt_keys k "
        "FULL JOIN receiver_receipts r USING (provider, webhook_id) "
        "WHERE k.webhook_id IS NULL OR r.webhook_id IS NULL OR k.bucket <> r.bucket",
    )
    assert stray == []


async def buckets(store: Store) -> list[int]:
    return [r["bucket"] for r in await rows(store, "SELECT bucket FROM receiver_partitions")]


async def tables(store: Store) -> set[str]:
    named = "SELECT relname FROM pg_class WHERE relname ~ '^receiver_receipts_p[0-9]+$'"
    found = await rows(store, named)
    return {r["relname"] for r in found}


async def indexes(store: Store) -> set[str]:
    """The indexes of receiver_receipts, by name and definition (the partitioned table's are
    written ON ONLY)."""
    found = await rows(
        store,
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'receiver_receipts'",
    )
    return {f"{r['indexname']}: {r['indexdef'].replace(' ON ONLY ', ' ON ')}" for r in found}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "receiver"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


async def test_the_conversions_keep_every_receipt_and_its_answer(single_url: str) -> None:
    clock = Clock()
    async with PostgresStore(single_url) as store:
        rx, recorder = make_receiver(store, clock=clock)
        await rx.open()
        first = {f"msg_{i}": await deliver(rx, f"msg_{i}", clock, order=i) for i in range(5)}
        recorder.fail_next("msg_failing")
        failed = await deliver(rx, "msg_failing", clock)
        assert failed.status_code == 500
        await rx.close()

    async with PostgresStore(single_url) as store:
        single = await indexes(store)
    converted = cli("migrate", "--store", single_url, "--layout", "partitioned")
    assert converted.returncode == 0, converted.stderr
    assert "receiver_receipts now has the partitioned layout" in converted.stdout
    again = cli("migrate", "--store", single_url, "--layout", "partitioned")
    assert "already had the partitioned layout" in again.stdout
    checked = cli("migrate", "--check", "--layout", "partitioned", "--store", single_url)
    assert checked.returncode == 0, checked.stderr

    async with PostgresStore(single_url) as store:
        # The partitioned table has every index of the single table (a migration that adds
        # one must add it to the conversion too), and each partition its primary key.
        assert await indexes(store) == {
            i for i in single if not i.startswith("receiver_receipts_pkey:")
        }
        await consistent(store)
        rx, recorder = make_receiver(store, clock=clock)
        await rx.open()
        for webhook_id, answer in first.items():
            replay = await deliver(rx, webhook_id, clock, order=int(webhook_id[4:]))
            assert (replay.status_code, replay.content) == (answer.status_code, answer.content)
        assert not recorder.calls  # nothing ran again
        fresh = await deliver(rx, "msg_new", clock, order=9)
        assert fresh.status_code == 200
        assert (await deliver(rx, "msg_failing", clock)).status_code == 200  # the retry runs
        assert await effects(store) == 7  # five, the new one, the retry (the failure rolled back)
        await consistent(store)
        await rx.close()

    check = cli("migrate", "--check", "--layout", "single", "--store", single_url)
    assert check.returncode == 1
    assert "has the partitioned layout, not single" in check.stderr
    back = cli("migrate", "--store", single_url, "--layout", "single")
    assert back.returncode == 0, back.stderr
    async with PostgresStore(single_url) as store:
        async with store.acquire() as conn:
            assert await partitions.layout(conn) == "single"
            assert await conn.fetchval("SELECT to_regclass('receiver_receipt_keys')") is None
        assert await indexes(store) == single
        rx, recorder = make_receiver(store, clock=clock)
        await rx.open()
        for webhook_id, answer in first.items():
            replay = await deliver(rx, webhook_id, clock, order=int(webhook_id[4:]))
            assert replay.content == answer.content
        assert not recorder.calls
        await rx.close()
    # The single table is the one the migrations make: the schema check still passes.
    assert cli("migrate", "--check", "--store", single_url).returncode == 0


async def test_a_receiver_serving_through_both_conversions_runs_each_delivery_once(
    single_url: str,
) -> None:
    """``receiver migrate --layout`` while a receiver serves: its deliveries wait behind the
    conversion's lock (or are answered 503 and sent again, as a sender would), none fails
    otherwise, the receiver's prepared statements find the new table, and each delivery runs
    once; its answers replay from either layout."""
    clock = Clock()
    async with PostgresStore(single_url) as store:
        rx, recorder = make_receiver(store, clock=clock)
        await rx.open()
        stop = asyncio.Event()
        answered: dict[str, bytes] = {}

        async def sender(n: int) -> None:
            i = 0
            while not stop.is_set():
                webhook_id = f"msg_{n}_{i}"
                while True:
                    answer = await deliver(rx, webhook_id, clock, order=n * 100_000 + i)
                    if answer.status_code == 200:
                        break
                    assert answer.status_code == 503, answer.text
                    await asyncio.sleep(0.05)
                answered[webhook_id] = answer.content
                i += 1

        try:
            senders = [asyncio.create_task(sender(n)) for n in range(4)]
            for layout in ("partitioned", "single", "partitioned"):
                await asyncio.sleep(0.3)
                done = await asyncio.to_thread(
                    cli, "migrate", "--store", single_url, "--layout", layout
                )
                assert done.returncode == 0, done.stderr
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*senders)
            twice = await rows(
                store, "SELECT webhook_id FROM effects GROUP BY webhook_id HAVING count(*) > 1"
            )
            assert twice == []
            assert await effects(store) == len(answered) > 20
            await consistent(store)
            ran = sum(recorder.calls.values())
            for webhook_id, content in answered.items():
                _, n, i = webhook_id.split("_")
                replay = await deliver(rx, webhook_id, clock, order=int(n) * 100_000 + int(i))
                assert (replay.status_code, replay.content) == (200, content)
            assert sum(recorder.calls.values()) == ran
        finally:
            stop.set()
            await rx.close()


def test_sqlite_has_no_layouts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    refused = cli("migrate", "--store", url, "--layout", "partitioned")
    assert refused.returncode != 0
    assert "only a PostgreSQL ledger has layouts" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert cli("migrate", "--check", "--layout", "single", "--store", url).returncode == 0


async def with_new_partition(
    store: PostgresStore, clock: Clock
) -> tuple[Receiver, Any, float, int]:
    """An open receiver, its window, and a partition opened now (the current one, which the
    test's deliveries go to): its number."""
    rx, recorder = make_receiver(store, clock=clock)
    await rx.open()
    await partitions.open_partition(store, clock.now)
    return rx, recorder, rx.providers[PROVIDER].window.window, max(await buckets(store))


async def test_a_drop_takes_what_expiry_deletes_and_moves_the_rest(parted: PostgresStore) -> None:
    clock = Clock()
    rx, recorder, window, old = await with_new_partition(parted, clock)
    assert (await deliver(rx, "msg_done", clock)).status_code == 200
    assert (await deliver(rx, "msg_failed", clock, mode="raise")).status_code == 500
    body = body_of("order.created", long=True)
    parsed = parse(body, None)
    # A handler still running past the window (it extended its lease): never dropped unrun.
    async with parted.acquire() as conn:
        claimed = await ledger.claim(
            conn,
            Claim(
                Key(PROVIDER, "msg_long"),
                parsed.payload_hash,
                "order.created",
                body,
                clock.now,
                10 * window,
                window,
            ),
        )
    assert isinstance(claimed, ledger.Claimed)

    clock.advance(window / 2)
    assert (await rx.sweep()).deleted == 0  # msg_done is within its window: nothing dropped
    assert old in await buckets(parted)

    clock.advance(window / 2 + DAY + 1)
    report = await rx.sweep()
    assert report.deleted == 1
    assert old not in await buckets(parted)
    assert f"receiver_receipts_p{old}" not in await tables(parted)
    kept = {
        r["webhook_id"]: r["state"]
        for r in await rows(parted, "SELECT webhook_id, state FROM receiver_receipts")
    }
    assert kept == {"msg_failed": "released", "msg_long": "in_flight"}
    await consistent(parted)
    # The dropped key is free again: its redelivery is a new delivery.
    assert (await deliver(rx, "msg_done", clock)).status_code == 200
    assert recorder.calls["msg_done"] == 2

    clock.advance(DEAD_LETTER_RETENTION + DAY)
    await rx.sweep()  # the dead letter's retention is over, the long claim was recovered
    await rx.sweep()
    left = {r["webhook_id"] for r in await rows(parted, "SELECT webhook_id FROM receiver_receipts")}
    assert "msg_failed" not in left
    await consistent(parted)
    await rx.close()


async def test_concurrent_claims_of_one_key_have_one_winner(parted: PostgresStore) -> None:
    body = body_of("order.created")
    parsed = parse(body, None)
    barrier = asyncio.Barrier(20)

    async def claim() -> bool:
        async with parted.acquire() as conn:
            await barrier.wait()
            outcome = await ledger.claim(
                conn,
                Claim(
                    Key(PROVIDER, "msg_race"),
                    parsed.payload_hash,
                    "order.created",
                    body,
                    None,
                    60.0,
                    3600.0,
                ),
            )
        return isinstance(outcome, ledger.Claimed)

    won = await asyncio.gather(*(claim() for _ in range(20)))
    assert won.count(True) == 1
    await consistent(parted)


async def test_redeliveries_racing_a_drop_run_each_handler_once(parted: PostgresStore) -> None:
    """Expired receipts in a partition being dropped, each redelivered by many senders at once
    while the sweep drops it: each key runs its handler at most once more, and whatever a
    delivery completed survives the drop."""
    clock = Clock()
    rx, recorder, window, _ = await with_new_partition(parted, clock)
    keys = [f"msg_{i}" for i in range(30)]
    for key in keys:
        assert (await deliver(rx, key, clock)).status_code == 200
    clock.advance(window + DAY + 1)
    barrier = asyncio.Barrier(len(keys) * 3 + 1)

    async def redeliver(key: str) -> int:
        await barrier.wait()
        return (await deliver(rx, key, clock)).status_code

    async def sweep() -> int:
        await barrier.wait()
        return (await rx.sweep()).deleted

    *answers, dropped = await asyncio.gather(
        *(redeliver(key) for key in keys for _ in range(3)), sweep()
    )
    await rx.sweep()  # a drop that gave way to the deliveries finishes now
    await consistent(parted)
    for key in keys:
        assert recorder.calls[key] <= 2  # the first delivery, and at most one after expiry
        # Whatever ran after expiry is on record: a redelivery now replays it.
        assert (await deliver(rx, key, clock)).status_code == 200
        assert recorder.calls[key] <= 2
    assert set(answers) <= {200, 409, 503}
    assert await effects(parted) == sum(recorder.calls.values())
    assert dropped >= 0
    await rx.close()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("deliver"), st.integers(0, 4)),
            st.tuples(st.just("advance"), st.sampled_from([60.0, 3600.0, DAY, 3 * DAY])),
            st.tuples(st.just("sweep"), st.just(0)),
            st.tuples(st.just("open"), st.just(0)),
        ),
        max_size=25,
    )
)
async def test_any_interleaving_keeps_keys_and_receipts_together(
    pg_partitioned_url: str, steps: list[tuple[str, Any]]
) -> None:
    """Deliveries, time, sweeps and new partitions in any order: the key table and the receipts
    agree after every step, and a delivery within its window after a completion never runs
    its handler again."""
    await truncate(pg_partitioned_url)
    clock = Clock()
    async with PostgresStore(pg_partitioned_url) as store:
        rx, recorder = make_receiver(store, clock=clock)
        await rx.open()
        window = rx.providers[PROVIDER].window.window
        completed_at: dict[str, float] = {}
        for action, value in steps:
            if action == "deliver":
                key = f"msg_{value}"
                runs = recorder.calls.get(key, 0)
                assert (await deliver(rx, key, clock)).status_code == 200
                if key in completed_at and clock.now < completed_at[key] + window:
                    assert recorder.calls[key] == runs  # replayed, not run
                if recorder.calls[key] > runs:
                    completed_at[key] = clock.now
            elif action == "advance":
                clock.advance(value)
            elif action == "sweep":
                await rx.sweep()
            else:
                await partitions.open_partition(store, clock.now)
            await consistent(store)
        await rx.close()


async def test_a_drop_waits_for_no_transaction_longer_than_its_lock_timeout(
    parted: PostgresStore, pg_partitioned_url: str
) -> None:
    """A transaction holding the ledger open (a long handler's) makes the drop give way: the
    sweep returns, the partition stays, and the next pass drops it."""
    clock = Clock()
    rx, _, window, old = await with_new_partition(parted, clock)
    assert (await deliver(rx, "msg_1", clock)).status_code == 200
    clock.advance(window + DAY + 1)
    holder = await asyncpg.connect(pg_partitioned_url)
    try:
        async with holder.transaction():
            await holder.fetch("SELECT 1 FROM receiver_receipts WHERE webhook_id = 'x'")
            assert (await rx.sweep()).deleted == 0
            assert old in await buckets(parted)
    finally:
        await holder.close()
    assert (await rx.sweep()).deleted == 1
    assert old not in await buckets(parted)
    await rx.close()


async def expired_in_old_partition(
    store: PostgresStore, clock: Clock
) -> tuple[Receiver, Any, int, float]:
    """msg_1 completed in a partition that is no longer the current one, its window over."""
    rx, recorder, window, old = await with_new_partition(store, clock)
    assert (await deliver(rx, "msg_1", clock)).status_code == 200
    clock.advance(window + 1)
    await partitions.open_partition(store, clock.now)
    return rx, recorder, old, window


async def test_a_receipt_revived_before_the_close_is_moved_not_dropped(
    parted: PostgresStore,
) -> None:
    """The sweep judged msg_1 expired and moved nothing; then its redelivery ran the handler
    again, in the old partition. The last step moves it out before the drop, so that the next
    redelivery replays instead of running a third time."""
    clock = Clock()
    rx, recorder, old, _ = await expired_in_old_partition(parted, clock)
    async with parted.acquire() as conn:
        assert await partitions.move_kept(conn, old, clock.now, DEAD_LETTER_RETENTION)
        assert (await deliver(rx, "msg_1", clock)).status_code == 200  # revived: run again
        assert await partitions.close(conn, old, clock.now, DEAD_LETTER_RETENTION)
        assert await partitions.finish(conn, old, clock.now, DEAD_LETTER_RETENTION) == 0
    assert old not in await buckets(parted)
    await consistent(parted)
    assert (await deliver(rx, "msg_1", clock)).status_code == 200
    assert recorder.calls["msg_1"] == 2
    assert await effects(parted, "msg_1") == 2
    await rx.close()


async def test_a_closed_partition_refuses_a_revival_until_it_is_dropped(
    parted: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Between the close and the drop, a redelivery of a receipt in the partition is answered
    with a retry, and its handler's work is rolled back; after the drop it runs once."""
    clock = Clock()
    rx, _, old, _ = await expired_in_old_partition(parted, clock)
    caplog.set_level(logging.DEBUG)
    async with parted.acquire() as conn:
        assert await partitions.move_kept(conn, old, clock.now, DEAD_LETTER_RETENTION)
        assert await partitions.close(conn, old, clock.now, DEAD_LETTER_RETENTION)
        refused = await deliver(rx, "msg_1", clock)
        assert refused.status_code == 503, refused.text
        assert "retry-after" in refused.headers
        assert "Failing row" not in caplog.text  # the row the check refused is never logged
        assert "check constraint" not in caplog.text
        assert await effects(parted, "msg_1") == 1
        assert await partitions.finish(conn, old, clock.now, DEAD_LETTER_RETENTION) == 1
    assert (await deliver(rx, "msg_1", clock)).status_code == 200
    assert (await deliver(rx, "msg_1", clock)).status_code == 200
    assert await effects(parted, "msg_1") == 2
    await consistent(parted)
    await rx.close()


def test_no_migration_builds_an_index_on_the_receipts_concurrently_yet() -> None:
    """CREATE INDEX CONCURRENTLY cannot build on a partitioned table: a migration that adds an
    index to receiver_receipts needs the runner to build it per partition (CONTRIBUTING.md,
    "Adding a migration"). The ones shipped before the layout ran before any ledger had it."""
    folder = ROOT / "receiver" / "_store" / "sql" / "migrations" / "postgresql"
    late = [
        path.name
        for path in sorted(folder.glob("*.sql"))
        if int(path.name[:4]) > 8
        and re.search(r"CONCURRENTLY[^;]*\bON\s+receiver_receipts\b", path.read_text(), re.I)
    ]
    assert late == [], f"{late}: build per partition on the partitioned layout first"
