"""Bulk replay on both stores, through the console's ASGI app and the ledger: the dry run, the
typed confirmation, the job a runner takes under a lease (two never run one delivery twice), a
crash judged item by item, cancelling, queued dead letters back to the workers, one audit row
with the outcome counts, and the CLI twin."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from receiver import Receiver, Store
from receiver._console import Console, bulk
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key
from receiver.testing import Sender

from . import bulkapp
from .test_console import audit_rows, csrf_of, notice_after
from .test_sessions import client_of

RECEIVER = str(Path(sys.executable).parent / "receiver")


@pytest.fixture
async def rx(store: Store) -> Receiver:
    await bulkapp.prepare(store)
    return bulkapp.make(store)


async def wait_for(store: Store, job: int, state: str = "done", seconds: float = 30) -> Any:
    for _ in range(int(seconds / 0.05)):
        async with store.acquire() as conn:
            row = await conn.run("bulk_job_get", job, store.now())
        if row is not None and row["state"] == state:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job} is not {state}: {dict(row) if row else None}")


async def jobs(store: Store) -> int:
    async with store.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM receiver_bulk_jobs"))


async def test_a_dry_run_then_the_typed_count_runs_each_delivery_once(
    rx: Receiver, store: Store
) -> None:
    await bulkapp.fail_many(rx, "shop", [f"s{n:03d}" for n in range(30)])
    await bulkapp.fail_many(rx, "billing", ["b1", "b2"])
    await bulkapp.fail_many(rx, "shop", ["odd"], error="ValueError: bad address")
    console = Console(store, receiver=rx, bulk_rate=1000)
    async with console.lifespan(), client_of(console) as client:
        listing = await client.get("/receipts", params={"provider": "shop", "state": "released"})
        assert "Replay all matching deliveries" in listing.text
        dry = await client.get(
            "/bulk", params={"provider": "shop", "error": "TIMED OUT", "count": "1"}
        )
        assert dry.status_code == 200, dry.text[-500:]
        assert "30 deliveries would run" in dry.text
        assert len(re.findall(r"<td>shop</td>", dry.text)) == bulk.SAMPLE
        assert "odd" not in dry.text
        request = re.search(r'name="request" value="([^"]+)"', dry.text)
        assert request is not None
        form = {
            "csrf": csrf_of(dry.text),
            "provider": "shop",
            "error": "TIMED OUT",
            "request": request.group(1),
            "reason": "inventory service is back",
            "operator": "Ada",
        }
        wrong = await client.post("/bulk", data={**form, "count": "29"})
        assert wrong.status_code == 409
        assert "matches 30 deliveries now, not 29" in wrong.text
        assert await jobs(store) == 0
        assert await audit_rows(store) == []
        done = await client.post("/bulk", data={**form, "count": "30"})
        assert done.status_code == 303, done.text[-500:]
        job = int(done.headers["location"].rpartition("=")[2])
        assert await notice_after(client, done) == f"Bulk replay {job} started"
        again = await client.post("/bulk", data={**form, "count": "30"})  # a second click
        assert again.headers["location"] == done.headers["location"]
        row = await wait_for(store, job)
        assert (row["total"], row["done"]) == (30, 30)
        page = await client.get(done.headers["location"])
        assert "30 executed" in page.text
        assert 'http-equiv="refresh"' not in page.text  # finished: no more refreshes
    assert await jobs(store) == 1
    ran = await bulkapp.runs(store)
    assert ran == {f"s{n:03d}": 1 for n in range(30)}
    (audit,) = await audit_rows(store)
    assert (audit["actor"], audit["action"], audit["outcome"]) == (
        "Ada (as typed)",
        "bulk replay",
        "done",
    )
    assert audit["detail"] == "30 executed"
    assert audit["webhook_id"] == f"job {job}"


async def test_two_runners_never_run_a_delivery_twice(rx: Receiver, store: Store) -> None:
    await bulkapp.fail_many(rx, "shop", [f"s{n:03d}" for n in range(40)])
    first = await bulk.create(
        store, "ada", bulk.Filter(provider="shop"), "40", "why", "r" * 10, 500
    )
    runners = [bulk.Runner(store, rx.replay, owner=f"console-{n}") for n in range(2)]
    gate = asyncio.Event()

    async def run(runner: bulk.Runner) -> str | None:
        await gate.wait()
        return await runner.run(first)

    tasks = [asyncio.create_task(run(r)) for r in runners]
    gate.set()
    results = await asyncio.gather(*tasks)
    assert sorted(map(str, results)) == ["None", "done"]
    assert await bulkapp.runs(store) == {f"s{n:03d}": 1 for n in range(40)}


async def test_many_clicks_at_once_make_one_job(rx: Receiver, store: Store) -> None:
    """The same confirmation sent eight times at once (a double click, a retried request, two
    tabs): one job, one snapshot, one audit row."""
    await bulkapp.fail_many(rx, "shop", [f"s{n}" for n in range(10)])
    gate = asyncio.Event()

    async def click() -> int:
        await gate.wait()
        return await bulk.create(store, "ada", bulk.Filter(), "10", "why", "same-form-id", 50)

    tasks = [asyncio.create_task(click()) for _ in range(8)]
    gate.set()
    made = await asyncio.gather(*tasks)
    assert len(set(made)) == 1
    assert await jobs(store) == 1
    async with store.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM receiver_bulk_items") == 10
    assert len(await audit_rows(store)) == 1


async def test_an_interrupted_job_is_judged_item_by_item(rx: Receiver, store: Store) -> None:
    """What a crash leaves, for each kind of item, and what the next runner makes of it."""
    ids = ["never", "ran", "ran_failed", "running", "moved"]
    await bulkapp.fail_many(rx, "shop", ids)
    job = await bulk.create(store, "ada", bulk.Filter(provider="shop"), "5", "why", "x" * 10, 500)
    async with store.acquire() as conn:
        for webhook_id in ids[:4]:  # the crashed runner had started these
            await conn.execute(
                "UPDATE receiver_bulk_items SET state = 'started' WHERE webhook_id = $1",
                webhook_id,
            )
    await rx.replay("shop", "ran")  # its replay ran and committed, then the crash
    await bulkapp.broken(store, True)
    await rx.replay("shop", "ran_failed")  # its replay ran and failed again
    await rx.replay("shop", "moved")  # a pending item another operator replayed meanwhile
    await bulkapp.broken(store, False)
    async with store.acquire() as conn:  # in flight under the crashed replay's live lease
        got = await ledger.lookup(conn, Key("shop", "running"))
        assert got is not None
        assert (
            await conn.run(
                "reclaim",
                "shop",
                "running",
                got.fence,
                got.payload_hash,
                got.event_type,
                store.now(),
                60.0,
                86400.0,
                got.request_body,
            )
            is not None
        )
    before = await bulkapp.runs(store)
    runner = bulk.Runner(store, rx.replay)
    assert await runner._lease(job) is not None
    async with store.acquire() as conn:
        items = {r["webhook_id"]: r for r in await conn.run_all("bulk_items_next", job, 10)}
    found = {i: await runner._item(job, items[i]) for i in ids}
    assert found == {
        "never": "executed",  # still at its fence: it never ran, so it runs now
        "ran": "executed",  # one fence on and completed: recorded, not run again
        "ran_failed": "failed again",
        "running": None,  # wait for the attempt's lease
        "moved": "changed",
    }
    after = await bulkapp.runs(store)
    assert {k: after.get(k, 0) - before.get(k, 0) for k in ids} == {
        "never": 1,
        "ran": 0,
        "ran_failed": 0,
        "running": 0,
        "moved": 0,
    }


async def test_what_a_sender_did_to_items_a_dead_runner_never_reached_is_not_counted(
    rx: Receiver, store: Store
) -> None:
    """A runner dies in its first item's replay; before the job is taken over, the senders'
    own retries run two items it never reached (one succeeds, one fails again). Those two are
    counted ``changed``: the job did not run them, and they are not its outcomes."""
    ids = [f"s{n}" for n in range(5)]
    await bulkapp.fail_many(rx, "shop", ids)
    job = await bulk.create(store, "ada", bulk.Filter(provider="shop"), "5", "why", "d" * 10, 500)
    inside = asyncio.Event()

    async def dies_inside(provider: str, webhook_id: str) -> Any:
        inside.set()
        await asyncio.Event().wait()  # the process dies here

    dead = asyncio.create_task(bulk.Runner(store, dies_inside, owner="dead").run(job))
    await inside.wait()
    dead.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dead
    assert await bulkapp.resend(rx, "shop", "s3") == 200
    await bulkapp.broken(store, True)
    assert await bulkapp.resend(rx, "shop", "s4") == 500
    await bulkapp.broken(store, False)
    # Taken over (the dead runner's owner id: its lease needs no waiting for).
    assert await bulk.Runner(store, rx.replay, owner="dead").run(job) == "done"
    assert await bulk.outcomes(store, job) == {"executed": 3, "changed": 2}
    assert await bulkapp.runs(store) == {"s0": 1, "s1": 1, "s2": 1, "s3": 1}


async def test_cancelling_stops_between_two_deliveries(rx: Receiver, store: Store) -> None:
    await bulkapp.fail_many(rx, "shop", [f"s{n:03d}" for n in range(20)])
    job = await bulk.create(store, "ada", bulk.Filter(), "20", "why", "c" * 10, 5)
    task = asyncio.create_task(bulk.Runner(store, rx.replay).run(job))
    await asyncio.sleep(0.5)
    assert await bulk.cancel(store, job)
    assert await task == "cancelled"
    counts = await bulk.outcomes(store, job)
    assert 0 < counts.get("executed", 0) < 20
    assert counts["to do"] == 20 - counts["executed"]
    assert sum((await bulkapp.runs(store)).values()) == counts["executed"]
    (audit,) = await audit_rows(store)
    assert audit["outcome"] == "cancelled"


async def test_queued_dead_letters_go_back_to_the_workers(rx: Receiver, store: Store) -> None:
    from tests.integration.test_queued import drain

    async with rx:
        await bulkapp.broken(store, True)
        async with Sender(rx, "jobs", bulkapp.SECRET) as sender:
            for n in range(3):
                assert (
                    await sender.send(sender.event("order.created", {}, id=f"q{n}"))
                ).status == 202
        await drain(rx)
        await bulkapp.broken(store, False)
        before = await bulkapp.runs(store)
        job = await bulk.create(
            store, "ada", bulk.Filter(provider="jobs", state="failed"), "3", "why", "q" * 10, 500
        )
        assert await bulk.Runner(store, rx.replay).run(job) == "done"
        assert await bulk.outcomes(store, job) == {"queued": 3}
        await drain(rx)
    after = await bulkapp.runs(store)
    assert {k: after[k] - before.get(k, 0) for k in after} == {"q0": 1, "q1": 1, "q2": 1}


@pytest.mark.parametrize(
    "params",
    [
        {"state": "completed"},
        {"since": "yesterday"},
        {"since": "2h", "until": "3h"},
        {"since": "\u00b2h"},  # passes str.isdigit(), fails int()
        {"since": "99999999999999d"},  # before year 1
        {"until": "99999999999999"},  # after year 9999
        {"since": "0001-01-01T00:00"},
        {"provider": "action:refund"},
        {"error": "x" * 600},
    ],
)
async def test_a_bad_filter_is_a_bad_request(
    rx: Receiver, store: Store, params: dict[str, str]
) -> None:
    console = Console(store, receiver=rx)
    async with client_of(console) as client:
        answer = await client.get("/bulk", params={**params, "count": "1"})
    assert answer.status_code == 400, answer.text[-300:]


def test_the_cli_twin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    rx = bulkapp.make(url)

    async def seed() -> None:
        async with rx:
            await bulkapp.prepare(rx.store)
            await bulkapp.fail_many(rx, "shop", [f"s{n}" for n in range(12)])

    async def check() -> tuple[dict[str, int], list[dict[str, Any]]]:
        async with rx:
            return await bulkapp.runs(rx.store), await audit_rows(rx.store)

    asyncio.run(seed())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env["RECEIVER_BULK_STORE"] = url

    def replay(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                RECEIVER,
                "replay",
                "--app",
                "tests.console.bulkapp:rx",
                "--filter",
                "provider=shop",
                *args,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )

    dry = replay("--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "12 deliveries match (provider=shop)" in dry.stdout
    wrong = replay("--yes", "11", "--reason", "inventory is back")
    assert wrong.returncode == 2
    assert "matches 12 deliveries now, not 11" in wrong.stderr
    # Spaces name nobody: the audit records the OS user, as without --actor.
    done = replay("--yes", "12", "--rate", "500", "--reason", "inventory is back", "--actor", " ")
    assert done.returncode == 0, done.stderr
    assert "bulk replay 1 done: 12 executed" in done.stdout
    ran, audit = asyncio.run(check())
    assert ran == {f"s{n}": 1 for n in range(12)}
    (row,) = audit
    assert (row["action"], row["outcome"], row["detail"]) == ("bulk replay", "done", "12 executed")
    assert "inventory is back" in row["reason"]
    assert row["actor"].endswith("(receiver replay)"), row["actor"]


def test_a_job_confirmed_without_handlers_waits_for_them(tmp_path: Path) -> None:
    """A console over the store alone counts and confirms; the job waits in the ledger until
    something with handlers takes it: here ``receiver replay --job``."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    rx = bulkapp.make(url)

    async def confirm() -> tuple[str, dict[str, Any]]:
        async with rx:
            await bulkapp.prepare(rx.store)
            await bulkapp.fail_many(rx, "shop", [f"s{n}" for n in range(5)])
            async with client_of(Console(rx.store)) as client:
                dry = await client.get("/bulk", params={"count": "1"})
                request = re.search(r'name="request" value="([^"]+)"', dry.text)
                assert request is not None
                done = await client.post(
                    "/bulk",
                    data={
                        "csrf": csrf_of(dry.text),
                        "request": request.group(1),
                        "count": "5",
                        "reason": "after the outage",
                        "operator": "Ada",
                    },
                )
                notice = await notice_after(client, done)
            async with rx.store.acquire() as conn:
                job = await conn.run("bulk_job_get", 1, None)
            assert job is not None
            return notice, dict(job)

    notice, job = asyncio.run(confirm())
    assert "no handlers" in notice
    assert (job["state"], job["done"], job["total"]) == ("running", 0, 5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}

    def job(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RECEIVER, "replay", "--app", "tests.console.bulkapp:rx", "--job", "1", *more],
            env={**env, "RECEIVER_BULK_STORE": url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )

    dry = job("--dry-run")  # runs nothing: a job is never "dry"
    assert dry.returncode == 2, dry.stdout
    assert "give no --filter, --yes or --dry-run" in dry.stderr
    ran = job()
    assert ran.returncode == 0, ran.stderr
    assert "bulk replay 1 done: 5 executed" in ran.stdout

    async def check() -> dict[str, int]:
        async with rx:
            return await bulkapp.runs(rx.store)

    assert asyncio.run(check()) == {f"s{n}": 1 for n in range(5)}


@pytest.mark.parametrize("text", ["\u00b2", "\u0663", "1" * 19, "", "-1"])
def test_a_bulk_job_id_is_ascii_digits(text: str) -> None:
    # "²" and "٣" pass str.isdigit() and fail int(): a 400, not a 500.
    from receiver._console.bulk_pages import _job_id
    from receiver._console.forms import BadRequest

    with pytest.raises(BadRequest):
        _job_id(text)
    assert _job_id("12") == 12
