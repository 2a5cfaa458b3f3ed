"""The action executor against DBOS durable workflows, on the same PostgreSQL, in interleaved
rounds of one run (``python -m benchmarks.dbos_peer``; ``python -m benchmarks`` runs it too,
``--dbos 0`` skips it).

Every action writes one business row (``dbos_rows``, no unique key, so that an action that ran
twice shows as two rows with the same job id). Three sides, each in a database of its own
(``receiver_bench_dbos_<side>``, dropped and created again) and each in a process of its own
(DBOS is a process-wide singleton):

- ``receiver``: ``Actions.execute`` of a transactional tool whose INSERT goes through ``tx``;
  the row and the action's completion commit together: **exactly-once**.
- ``dbos_step``: a ``@DBOS.workflow`` (started under ``SetWorkflowID(job)``, the action's id)
  whose ``@DBOS.step`` INSERTs on its own asyncpg pool, as DBOS's documentation writes steps:
  the row commits, then DBOS checkpoints the step's output; a crash between the two runs the
  step again on recovery: **at-least-once**.
- ``dbos_tx``: the same workflow whose step is an ``AsyncSQLAlchemyDatasource.transaction``
  (READ COMMITTED, the receiver's isolation): DBOS writes the step's checkpoint in the
  transaction of the INSERT: **exactly-once** for the row.

Measured: actions (workflows) completed per second, sequentially (one caller) and with 32
concurrent callers; each side's pool holds 10 connections (DBOS: ``sys_db_pool_size=10``, plus
10 for the step's own pool or the datasource's engine).

Checked in the run: each side is **SIGKILLed mid-run** (32 callers), then recovers the way it
is meant to: the receiver's caller executes every action id again once the dead attempts'
leases ran out (a transactional tool's dead attempt is run again, a completed one is replayed);
DBOS is launched again and recovers its pending workflows. The runner then counts job ids with
two business rows. An exactly-once side must have none. No network beyond loopback: DBOS runs
without Conductor, OTLP export or cloud mode (its environment variables are removed).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
SIDES = ("receiver", "dbos_step", "dbos_tx")
ROWS = "CREATE TABLE IF NOT EXISTS dbos_rows (job text NOT NULL, at timestamptz DEFAULT now())"
INSERT = "INSERT INTO dbos_rows (job) VALUES ($1)"
CONCURRENCY = 32
LEASE = 2.0  # the receiver's lease in the kill check: how long a dead attempt holds its key
GUARANTEE = {
    "receiver": "exactly-once (the tool's tx INSERT commits with the action's completion)",
    "dbos_step": "at-least-once (the step's INSERT commits, then its output is checkpointed)",
    "dbos_tx": "exactly-once (the datasource transaction commits the INSERT and the checkpoint)",
}


def _db_url(base: str, side: str) -> str:
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path=f"/receiver_bench_dbos_{side}"))


async def _recreate(base: str, side: str) -> str:
    url = _db_url(base, side)
    await fresh_pg(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(ROWS)
    finally:
        await conn.close()
    return url


# -- the sides, in their own processes -------------------------------------------------------

Run = Callable[[str], Awaitable[Any]]


def _local_only() -> None:
    """DBOS talks to nothing but the local PostgreSQL: no Conductor, no cloud mode, no OTLP."""
    for name in list(os.environ):
        if name.startswith(("DBOS_", "DBOS__", "OTEL_")):
            del os.environ[name]


async def _receiver(url: str) -> tuple[Run, Callable[[], Awaitable[None]]]:
    from receiver import Actions, Connection, PostgresStore, ToolCall

    store = PostgresStore(url, max_size=10)
    await store.open()
    await store.migrate()
    actions = Actions(store, metrics=False, lease=LEASE, sweep_interval=None)

    @actions.tool("insert_row", effects="transactional")
    async def insert_row(call: ToolCall, tx: Connection) -> Any:
        await tx.execute(INSERT, call.request["job"])
        return {"job": call.request["job"]}

    async def one(job: str) -> Any:
        action = actions.propose("insert_row", scope="bench", action_id=job, request={"job": job})
        return (await actions.execute(action)).value

    return one, store.close


async def _pool(url: str) -> asyncpg.Pool:
    return await asyncpg.create_pool(url, min_size=1, max_size=10)


async def _dbos(url: str, side: str) -> tuple[Run, Callable[[], Awaitable[None]]]:
    _local_only()
    from dbos import DBOS, AsyncSQLAlchemyDatasource, SetWorkflowID
    from sqlalchemy import text

    DBOS(
        config={
            "name": "receiver-bench",
            "system_database_url": url,
            "sys_db_pool_size": 10,
            "log_level": "WARNING",
            "enable_otlp": False,
        }
    )
    insert_row: Callable[[str], Awaitable[str]]
    if side == "dbos_step":
        # Workflows recovered at launch run on DBOS's own event loop: one pool per loop.
        pools: dict[asyncio.AbstractEventLoop, asyncio.Task[asyncpg.Pool]] = {}

        async def pool() -> asyncpg.Pool:
            loop = asyncio.get_running_loop()
            if loop not in pools:
                pools[loop] = loop.create_task(_pool(url))
            return await pools[loop]

        @DBOS.step()
        async def step_insert(job: str) -> str:
            await (await pool()).execute(INSERT, job)
            return job

        insert_row = step_insert
    else:
        datasource = await AsyncSQLAlchemyDatasource.create(
            url.replace("postgresql://", "postgresql+psycopg://", 1),
            engine_kwargs={"pool_size": 10, "max_overflow": 0},
        )

        async def tx_insert(job: str) -> str:
            await datasource.sql_session().execute(
                text("INSERT INTO dbos_rows (job) VALUES (:job)"), {"job": job}
            )
            return job

        insert_row = datasource.transaction(isolation_level="READ COMMITTED")(tx_insert)

    @DBOS.workflow(name="action")
    async def action(job: str) -> str:
        return await insert_row(job)

    async def one(job: str) -> Any:
        with SetWorkflowID(job):
            return await action(job)

    async def close() -> None:
        DBOS.destroy(destroy_registry=True)

    DBOS.launch()
    return one, close


async def _side(side: str, url: str) -> tuple[Run, Callable[[], Awaitable[None]]]:
    if side == "receiver":
        return await _receiver(url)
    return await _dbos(url, side)


def _write(out: Path, figures: dict[str, Any]) -> None:
    out.write_text(json.dumps(figures))


async def work(side: str, url: str, prefix: str, callers: int, seconds: float, out: Path) -> None:
    """``callers`` tasks executing fresh actions for ``seconds``; the count goes to ``out``."""
    one, close = await _side(side, url)
    try:
        for n in range(20):  # warm-up: pools, prepared statements, DBOS's first workflow
            await one(f"{prefix}-w{n}")
        counter = itertools.count()
        done = 0
        deadline = time.perf_counter() + seconds

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one(f"{prefix}-{next(counter)}")
                done += 1

        _write(out, {"started": True})
        began = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        elapsed = time.perf_counter() - began
        _write(out, {"count": done, "seconds": elapsed})
    finally:
        await close()


async def recover(side: str, url: str, prefix: str, upto: int) -> None:
    """After a kill: the receiver's caller executes every id again; DBOS is launched again
    and recovers the workflows the killed process left pending."""
    if side == "receiver":
        await asyncio.sleep(LEASE + 0.5)  # the dead attempts' leases run out
        one, close = await _side(side, url)
        try:
            jobs = iter(range(upto))

            async def caller() -> None:
                for n in jobs:
                    await one(f"{prefix}-{n}")

            await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
        finally:
            await close()
        return
    one, close = await _side(side, url)  # launch recovers this executor's pending workflows
    try:
        conn = await asyncpg.connect(url)
        try:
            deadline = time.monotonic() + 120
            while await conn.fetchval(
                "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('PENDING', 'ENQUEUED')"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("DBOS did not recover its pending workflows in 120 s")
                await asyncio.sleep(0.2)
        finally:
            await conn.close()
    finally:
        await close()


# -- the runner -------------------------------------------------------------------------------


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.dbos_peer", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def measure(
    side: str, url: str, prefix: str, callers: int, seconds: float, work_dir: Path
) -> float:
    out = work_dir / f"{side}-{prefix}.json"
    out.unlink(missing_ok=True)
    log = work_dir / f"{side}.log"
    process = _spawn(["--worker", side, url, prefix, str(callers), str(seconds), str(out)], log)
    if process.wait(timeout=seconds + 180) != 0:
        raise RuntimeError(f"{side} exited with {process.returncode}: see {log}")
    got = json.loads(out.read_text())
    return float(got["count"]) / float(got["seconds"])


async def _tally(side: str, url: str, prefix: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT job, count(*) AS n FROM dbos_rows WHERE job LIKE $1 || '-%' GROUP BY job",
            prefix,
        )
        if side == "receiver":
            done = await conn.fetchval(
                "SELECT count(*) FROM receiver_receipts "
                "WHERE state = 'completed' AND webhook_id LIKE $1",
                f"%:{prefix}-%",
            )
        else:
            done = await conn.fetchval(
                "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS' "
                "AND workflow_uuid LIKE $1 || '-%'",
                prefix,
            )
    finally:
        await conn.close()
    indexes = [int(r["job"].rsplit("-", 1)[1]) for r in rows if "-w" not in r["job"]]
    return {
        "done": int(done),
        "rows": sum(int(r["n"]) for r in rows),
        "twice": sum(1 for r in rows if r["n"] > 1),
        "max_index": max(indexes, default=0),
    }


def kill_check(side: str, url: str, prefix: str, seconds: float, work_dir: Path) -> dict[str, Any]:
    """32 callers, SIGKILLed after ``seconds`` of running; then recovery and the count."""
    out = work_dir / f"{side}-{prefix}.json"
    out.unlink(missing_ok=True)
    log = work_dir / f"{side}.log"
    process = _spawn(["--worker", side, url, prefix, str(CONCURRENCY), "600", str(out)], log)
    try:
        deadline = time.monotonic() + 120
        while not out.exists():
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{side} did not start: see {log}")
            time.sleep(0.05)
        time.sleep(seconds)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    at_kill = asyncio.run(_tally(side, url, prefix))
    upto = at_kill["max_index"] + CONCURRENCY + 1
    recovery = _spawn(["--recover", side, url, prefix, str(upto)], log)
    if recovery.wait(timeout=300) != 0:
        raise RuntimeError(f"{side} recovery exited with {recovery.returncode}: see {log}")
    after = asyncio.run(_tally(side, url, prefix))
    return {
        "side": side,
        "completed_at_kill": at_kill["done"],
        "rows_at_kill": at_kill["rows"],
        # Rows whose action is not recorded as done: the ones a recovery may run again.
        "rows_without_done_at_kill": at_kill["rows"] - at_kill["done"],
        "completed_after_recovery": after["done"],
        "rows_after_recovery": after["rows"],
        "ids_twice": after["twice"],
    }


def run(
    base: str,
    *,
    rounds: int = 2,
    seconds: float = 4.0,
    kill_after: float = 3.0,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    work_dir = work_dir or Path("benchmarks/results/tmp/dbos")
    work_dir.mkdir(parents=True, exist_ok=True)
    urls = {side: asyncio.run(_recreate(base, side)) for side in SIDES}
    figures: dict[str, dict[str, list[float]]] = {}
    for n in range(rounds):
        for mode, callers in (("sequential", 1), ("concurrent", CONCURRENCY)):
            for side in SIDES:  # interleaved: each side once per mode per round
                rate = measure(side, urls[side], f"r{n}{mode[0]}", callers, seconds, work_dir)
                figures.setdefault(mode, {}).setdefault(side, []).append(rate)
    checks = [kill_check(side, urls[side], "k", kill_after, work_dir) for side in SIDES]
    summary: dict[str, dict[str, float]] = {}
    for mode, sides in figures.items():
        summary[mode] = {side: round(sum(v) / len(v), 1) for side, v in sides.items()}
        for peer in SIDES[1:]:
            summary[mode][f"x_{peer}"] = round(summary[mode]["receiver"] / summary[mode][peer], 2)
    exactly_once = [c for c in checks if GUARANTEE[c["side"]].startswith("exactly")]
    return {
        "guarantee": GUARANTEE,
        "rounds": rounds,
        "seconds": seconds,
        "per_s": summary,
        "rounds_per_s": figures,
        "kill_checks": checks,
        # The receiver (and DBOS's transactions, which promise it too) must not run one twice.
        "ok": all(c["ids_twice"] == 0 for c in exactly_once),
    }


def describe(r: dict[str, Any]) -> str:
    lines = []
    for mode, s in r["per_s"].items():
        lines.append(
            f"{mode:10} actions/s: receiver {s['receiver']:>7,.0f}  DBOS step "
            f"{s['dbos_step']:>6,.0f} ({s['x_dbos_step']:.2f}x)  DBOS transaction "
            f"{s['dbos_tx']:>6,.0f} ({s['x_dbos_tx']:.2f}x)"
        )
    for c in r["kill_checks"]:
        lines.append(
            f"killed mid-run: {c['side']:9} completed {c['completed_at_kill']:>6}, rows "
            f"{c['rows_at_kill']:>6} (not done {c['rows_without_done_at_kill']}); after recovery "
            f"completed {c['completed_after_recovery']}, rows {c['rows_after_recovery']}, "
            f"ids twice {c['ids_twice']} [{r['guarantee'][c['side']]}]"
        )
    lines.append("checks " + ("ok" if r["ok"] else "FAILED: an exactly-once side ran twice"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dbos_peer", description=__doc__)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="per side, mode and round")
    parser.add_argument("--kill-after", type=float, default=3.0)
    parser.add_argument("--json", type=Path, help="write the figures there too")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--recover", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        side, url, prefix, callers, seconds, out = args.worker
        asyncio.run(work(side, url, prefix, int(callers), float(seconds), Path(out)))
        return 0
    if args.recover:
        side, url, prefix, upto = args.recover
        asyncio.run(recover(side, url, prefix, int(upto)))
        return 0
    result = run(args.pg_url, rounds=args.rounds, seconds=args.seconds, kill_after=args.kill_after)
    print(describe(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
