"""The receiver's queue against the job queues people use on PostgreSQL: pgqueuer and
procrastinate, on the same server, in interleaved rounds of one run (``python -m
benchmarks.peers``; ``python -m benchmarks`` runs it too, ``--peers 0`` skips it).

Each side has a database of its own on the benchmark server (``receiver_bench_peers_<side>``,
dropped and created again) and a business table without a unique key (``peer_rows``), so that
a job that ran twice shows as two rows.

- **enqueue, one at a time**: 64 producer tasks in one process, each enqueueing one job per
  call: the receiver's queued ingest (``Receiver.deliver`` of a signed delivery, answered 202
  once its receipt committed; concurrent ones share a statement), pgqueuer's ``enqueue``,
  procrastinate's ``defer_async``. Jobs per second.
- **enqueue, batched**: 1,000 jobs per call, 4 calls in flight: ``Receiver.enqueue_many``,
  pgqueuer's ``enqueue`` with lists, procrastinate's ``batch_defer_async``.
- **drain**: one worker process per side (32 concurrent jobs; pgqueuer ``batch_size=32``) over
  a backlog, with a no-op handler and with a handler that INSERTs one business row
  (the receiver: through ``tx``, committed with the completion; the peers: on their own
  connection, autocommitted, as their documentation does it). Jobs completed per second,
  counted from each side's own tables. Then the worker is **SIGKILLed mid-drain** and the
  runner compares business rows with completed jobs: a row whose job is not marked done runs
  again when the job is picked up again (at-least-once); equal counts and no id twice is
  exactly-once.

``--paths drain_insert --sides receiver,pgqueuer`` runs part of it; ``--group 1`` runs the
receiver's worker without group transactions (each delivery its own), for a before/after.

Guarantees, as each side documents them and as the kill checks:

- receiver: exactly-once for ``tx`` writes (the handler's writes and the fenced completion
  commit in one transaction; a worker runs up to 8 such deliveries in one transaction with
  all their fenced completions, all or nothing);
- pgqueuer: at-least-once (the handler's effects commit before the job's "done" is logged,
  which is buffered and batched);
- procrastinate: at-least-once (the job's status is updated after the task returned, in a
  transaction of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from receiver import Connection, Event, PostgresStore, Provider, Receiver, generate_secret

from . import load
from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
SIDES = ("receiver", "pgqueuer", "procrastinate")
PATHS = ("enqueue", "drain_noop", "drain_insert")
PROVIDER = "bench"
SECRET = generate_secret()  # the workers never verify: their receipts are stored
ROWS = "CREATE TABLE IF NOT EXISTS peer_rows (job text NOT NULL, at timestamptz DEFAULT now())"
GUARANTEE = {
    "receiver": "exactly-once (tx writes commit with the fenced completion)",
    "pgqueuer": "at-least-once (effects commit before the buffered done-log)",
    "procrastinate": "at-least-once (status updated after the task, separately)",
}


def _db_url(base: str, side: str) -> str:
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path=f"/receiver_bench_peers_{side}"))


def _body(job: str) -> bytes:
    return b'{"type":"order.created","id":"' + job.encode() + b'","pad":"' + b"x" * 200 + b'"}'


async def _recreate(base: str, side: str) -> str:
    url = _db_url(base, side)
    await fresh_pg(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(ROWS)
    finally:
        await conn.close()
    return url


# -- the sides ------------------------------------------------------------------------------


def _receiver(url: str, handler: str, pool: int = 10) -> Receiver:
    rx = Receiver(
        PostgresStore(url, max_size=pool),
        [Provider(PROVIDER, [SECRET], mode="queued", lease=5.0)],
        sweep_interval=None,
        metrics=False,
    )
    if handler == "insert":

        @rx.on("order.created")
        async def insert(event: Event, tx: Connection) -> None:
            await tx.execute("INSERT INTO peer_rows (job) VALUES ($1)", event.id)

    else:

        @rx.on("order.created")
        async def noop(event: Event, tx: Connection) -> None:
            return None

    return rx


def _procrastinate(url: str) -> Any:
    import procrastinate

    parts = urllib.parse.urlsplit(url)
    conninfo = f"host={parts.hostname} port={parts.port or 5432} user={parts.username} "
    conninfo += f"dbname={parts.path[1:]}"
    return procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=conninfo, min_size=1, max_size=10)
    )


async def setup(side: str, url: str) -> None:
    if side.startswith("receiver"):
        async with PostgresStore(url) as store:
            await store.migrate()
    elif side == "pgqueuer":
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(url)
        try:
            await Queries.from_asyncpg_connection(conn).install()
        finally:
            await conn.close()
    else:
        app = _procrastinate(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()


async def enqueue(
    side: str, url: str, ids: list[str], *, batch: int, producers: int
) -> tuple[float, int]:
    """Enqueue ``ids`` (one per call with ``producers`` tasks, or ``batch`` per call, 4 calls
    in flight); (seconds, jobs recorded)."""
    chunks = [ids[i : i + batch] for i in range(0, len(ids), batch)]
    lanes = producers if batch == 1 else 4
    call: Callable[[list[str]], Awaitable[None]]
    closer: Callable[[], Awaitable[None]]
    if side.startswith("receiver"):
        rx = _receiver(url, "noop")
        await rx.store.open()
        signer = load.Signer(SECRET)
        now = int(time.time())
        signed = {i: signer.sign(i, now, _body(i)) for i in ids} if batch == 1 else {}

        async def call(chunk: list[str]) -> None:
            if batch == 1:
                job = chunk[0]
                headers = {
                    "webhook-id": job,
                    "webhook-timestamp": str(now),
                    "webhook-signature": signed[job],
                }
                answer = await rx.deliver(PROVIDER, headers, _body(job))
                if answer.status_code != 202:
                    raise RuntimeError(f"ingest answered {answer.status_code}")
            else:
                await rx.enqueue_many(PROVIDER, [(job, _body(job)) for job in chunk])

        closer = rx.store.close
    elif side == "pgqueuer":
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgPoolDriver
        from pgqueuer.queries import Queries

        pool = await asyncpg.create_pool(url, min_size=1, max_size=10)
        queries = Queries(AsyncpgPoolDriver(pool))

        async def call(chunk: list[str]) -> None:
            if batch == 1:
                await queries.enqueue("job", chunk[0].encode())
            else:
                n = len(chunk)
                await queries.enqueue(["job"] * n, [j.encode() for j in chunk], [0] * n)

        closer = pool.close
    else:
        app = _procrastinate(url)
        await app.open_async()

        @app.task(name="job")  # type: ignore[untyped-decorator]
        async def job(job: str) -> None: ...

        async def call(chunk: list[str]) -> None:
            if batch == 1:
                await job.defer_async(job=chunk[0])
            else:
                await job.batch_defer_async(*({"job": j} for j in chunk))

        closer = app.close_async
    queue = list(reversed(chunks))

    async def lane() -> None:
        while queue:
            await call(queue.pop())

    try:
        began = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(lanes)))
        seconds = time.perf_counter() - began
    finally:
        await closer()
    return seconds, len(ids)


async def counts(side: str, url: str, enqueued: int) -> dict[str, int]:
    """Completed jobs by the side's own record, and business rows (all, and ids twice)."""
    conn = await asyncpg.connect(url)
    try:
        if side.startswith("receiver"):
            done = await conn.fetchval(
                "SELECT count(*) FROM receiver_receipts WHERE state = 'completed'"
            )
        elif side == "pgqueuer":
            # A finished job leaves the queue table (its "done" goes to pgqueuer_log).
            done = enqueued - await conn.fetchval("SELECT count(*) FROM pgqueuer")
        else:
            done = await conn.fetchval(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            )
        rows = await conn.fetchval("SELECT count(*) FROM peer_rows")
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT job FROM peer_rows GROUP BY job HAVING count(*) > 1) d"
        )
    finally:
        await conn.close()
    return {"done": int(done), "rows": int(rows), "twice": int(twice)}


def drain(
    side: str,
    url: str,
    handler: str,
    seconds: float,
    enqueued: int,
    work: Path,
    group: int = 8,
) -> dict[str, Any]:
    """One worker process over the backlog for ``seconds``, then SIGKILLed mid-drain."""
    log = (work / f"worker-{side}-{handler}.log").open("wb")
    command = ["--worker", side, url, handler, str(group)]
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.peers", *command],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while (start := asyncio.run(counts(side, url, enqueued)))["done"] == 0:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{side} worker did not start: see {log.name}")
            time.sleep(0.05)
        began = time.monotonic()
        time.sleep(seconds)
        end = asyncio.run(counts(side, url, enqueued))
        elapsed = time.monotonic() - began
        process.send_signal(signal.SIGKILL)  # mid-drain: the backlog outlasts the round
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
    after = asyncio.run(counts(side, url, enqueued))
    rate = (end["done"] - start["done"]) / elapsed
    extra = after["rows"] - after["done"] if handler == "insert" else 0
    return {
        "per_s": round(rate, 1),
        "completed_at_kill": after["done"],
        "rows_at_kill": after["rows"],
        # Rows whose job is not marked done: they run again when the job is picked again.
        "rows_without_done": extra,
        "ids_twice": after["twice"],
        "backlog_left": enqueued - after["done"],
    }


# -- the worker processes ------------------------------------------------------------------


async def work(side: str, url: str, handler: str, group: int = 8) -> None:
    if side == "receiver":
        rx = _receiver(url, handler, pool=10)
        await rx.open()
        worker = rx.worker(concurrency=32, poll_interval=0.5, group=group)
        await worker.run()
        return
    pool = await asyncpg.create_pool(url, min_size=1, max_size=10)
    if side == "pgqueuer":
        from pgqueuer import QueueManager
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgPoolDriver
        from pgqueuer.queries import Queries

        qm = QueueManager(Queries(AsyncpgPoolDriver(pool)))

        @qm.entrypoint("job")
        async def job(j: Any) -> None:
            if handler == "insert":
                await pool.execute(
                    "INSERT INTO peer_rows (job) VALUES ($1)", bytes(j.payload).decode()
                )

        await qm.run(
            batch_size=32,
            dequeue_timeout=timedelta(seconds=1),
            log_aggregation_interval=timedelta(0),
        )
        return
    app = _procrastinate(url)

    @app.task(name="job")  # type: ignore[untyped-decorator]
    async def pjob(job: str) -> None:
        if handler == "insert":
            await pool.execute("INSERT INTO peer_rows (job) VALUES ($1)", job)

    async with app.open_async():
        await app.run_worker_async(concurrency=32, install_signal_handlers=True)


# -- the run --------------------------------------------------------------------------------


def run(
    base: str,
    *,
    rounds: int = 2,
    jobs: int = 6_000,
    drain_seconds: float = 5.0,
    work_dir: Path | None = None,
    paths: tuple[str, ...] = PATHS,
    sides: tuple[str, ...] = SIDES,
    group: int = 8,
) -> dict[str, Any]:
    work_dir = work_dir or Path("benchmarks/results/tmp/peers")
    work_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"guarantee": GUARANTEE, "rounds": rounds, "jobs": jobs}
    figures: dict[str, dict[str, list[float]]] = {}
    checks: list[dict[str, Any]] = []
    for n in range(rounds):
        for mode, batch, producers in (("one", 1, 64), ("batched", 1000, 4)):
            if "enqueue" not in paths:
                break
            for side in sides:
                url = asyncio.run(_recreate(base, side))
                asyncio.run(setup(side, url))
                # Batched, 1,000 a call: five times the jobs, or the run is over before the
                # first calls have warmed their connections up.
                count = jobs * (5 if batch > 1 else 1)
                ids = [f"{side[0]}{n}{mode[0]}{i}" for i in range(count)]
                seconds, count = asyncio.run(
                    enqueue(side, url, ids, batch=batch, producers=producers)
                )
                figures.setdefault(f"enqueue_{mode}", {}).setdefault(side, []).append(
                    count / seconds
                )
        for handler in ("noop", "insert"):
            if f"drain_{handler}" not in paths:
                continue
            for side in sides:
                url = asyncio.run(_recreate(base, side))
                asyncio.run(setup(side, url))
                backlog = int(drain_seconds * 6_000) + 2_000
                ids = [f"{side[0]}{n}d{i}" for i in range(backlog)]
                asyncio.run(enqueue(side, url, ids, batch=1000, producers=4))
                got = drain(side, url, handler, drain_seconds, backlog, work_dir, group)
                figures.setdefault(f"drain_{handler}", {}).setdefault(side, []).append(got["per_s"])
                checks.append({"side": side, "handler": handler, "round": n, **got})
    summary: dict[str, dict[str, float]] = {}
    for name, by_side in figures.items():
        summary[name] = {side: round(sum(v) / len(v), 1) for side, v in by_side.items()}
        for peer in sides[1:] if sides[0] == "receiver" else ():
            summary[name][f"x_{peer}"] = round(summary[name]["receiver"] / summary[name][peer], 2)
    result["per_s"] = summary
    result["rounds_per_s"] = figures
    result["kill_checks"] = checks
    doubles = [
        c for c in checks if c["side"] == "receiver" and (c["rows_without_done"] or c["ids_twice"])
    ]
    result["ok"] = not doubles
    return result


def describe(r: dict[str, Any]) -> str:
    lines = []
    for name, s in r["per_s"].items():
        line = f"{name:16}"
        for side in SIDES:
            if side in s:
                ratio = f" ({s['x_' + side]:.2f}x)" if "x_" + side in s else ""
                line += f" {side} {s[side]:>9,.0f}/s{ratio} "
        lines.append(line.rstrip())
    for c in r["kill_checks"]:
        if c["handler"] == "insert":
            lines.append(
                f"killed mid-drain, round {c['round']}: {c['side']:13} completed "
                f"{c['completed_at_kill']:>6}, business rows {c['rows_at_kill']:>6}, rows "
                f"without done {c['rows_without_done']:>3}, ids twice {c['ids_twice']} "
                f"[{GUARANTEE[c['side']]}]"
            )
    lines.append("checks " + ("ok" if r["ok"] else "FAILED: the receiver ran a job twice"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=6_000)
    parser.add_argument("--drain-seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="write the figures there too")
    parser.add_argument(
        "--paths", default=",".join(PATHS), help="comma-separated, of " + ", ".join(PATHS)
    )
    parser.add_argument("--sides", default=",".join(SIDES), help="receiver first, if at all")
    parser.add_argument(
        "--group", type=int, default=8, help="the receiver worker's group (1: none)"
    )
    parser.add_argument(
        "--worker", nargs=4, metavar=("SIDE", "URL", "HANDLER", "GROUP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        side, url, handler, group = args.worker
        asyncio.run(work(side, url, handler, int(group)))
        return 0
    paths = tuple(args.paths.split(","))
    sides = tuple(args.sides.split(","))
    if unknown := (set(paths) - set(PATHS)) | (set(sides) - set(SIDES)):
        parser.error(f"unknown paths or sides: {', '.join(sorted(unknown))}")
    result = run(
        args.pg_url,
        rounds=args.rounds,
        jobs=args.jobs,
        drain_seconds=args.drain_seconds,
        paths=paths,
        sides=sides,
        group=args.group,
    )
    print(describe(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
