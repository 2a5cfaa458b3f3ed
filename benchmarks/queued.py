"""Queued mode (docs/how-to/queued.md): how fast deliveries are acknowledged, and how fast
workers drain them. ``python -m benchmarks.queued`` alone, or part of ``python -m benchmarks``
(``--queued ROUNDS``; 0 skips it). PostgreSQL only (the workers' store).

Ingest: wrk with fresh, pre-signed deliveries against three servers in interleaved rounds of
the same run: the queued receiver (answers 202 once the receipt is recorded; no worker runs
meanwhile), the inline receiver's fresh path (no-op handler), and the bare Starlette endpoint.
Drain: then one ``receiver worker`` process at a time works through what the queued rounds
recorded, topped up (in-process, through a queued receiver) to a backlog that outlasts the
drain, first with the no-op handler, then with the insert handler (one business row through
``tx``); deliveries per second per worker process, counted from the ledger.

Checks: every 202 wrk saw is a committed receipt, and no delivery's handler ran twice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from receiver import generate_secret

from . import checks, load, servers
from .business import BUSINESS_TABLE, PROVIDER
from .stores import PostgresTarget

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
SECRET = generate_secret()
RECEIVER = str(Path(sys.executable).parent / "receiver")


async def _count(url: str, sql: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def _receipts(url: str, state: str) -> int:
    return asyncio.run(
        _count(url, f"SELECT count(*) FROM receiver_receipts WHERE state = '{state}'")  # noqa: S608
    )


def _measure(
    server: servers.Server,
    data: Path,
    log: Path,
    work: Path,
    seconds: int,
    connections: int,
    template: load.Template,
) -> load.WrkResult:
    script = load.write_script(
        work / (log.name + ".lua"),
        data=data,
        log=log,
        port=server.port,
        target=f"/{PROVIDER}",
        template=template,
        threads=1,
    )
    return load.run_wrk(
        server.url(f"/{PROVIDER}"),
        script,
        log,
        duration=seconds,
        connections=connections,
        threads=1,
    )


def _summary(runs: list[load.WrkResult]) -> dict[str, float]:
    requests = sum(r.requests for r in runs)
    seconds = sum(r.seconds for r in runs)
    p99 = sorted(r.latency_us["p99"] for r in runs)[len(runs) // 2] / 1000
    p50 = sorted(r.latency_us["p50"] for r in runs)[len(runs) // 2] / 1000
    return {"rps": round(requests / seconds, 1), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2)}


async def _enqueue(url: str, count: int, ids: load.Ids, template: load.Template) -> None:
    """Record ``count`` fresh queued deliveries through an in-process queued receiver (signed
    and verified as over HTTP), so that each drain has a backlog of its own."""
    # benchmarks.app builds the served app from the environment when imported.
    os.environ.setdefault("BENCH_STORE", url)
    os.environ.setdefault("BENCH_SECRET", SECRET)
    from .app import build

    rx = build(url, SECRET, "noop", None, mode="queued")
    signer = load.Signer(SECRET)
    await rx.store.open()
    try:
        pending = ids.take(count)

        async def sender() -> None:
            while pending:
                webhook_id = pending.pop()
                body = template.body(webhook_id)
                now = int(time.time())
                headers = {
                    "webhook-id": webhook_id,
                    "webhook-timestamp": str(now),
                    "webhook-signature": signer.sign(webhook_id, now, body),
                }
                response = await rx.deliver(PROVIDER, headers, body)
                if response.status_code != 202:
                    raise RuntimeError(f"enqueueing answered {response.status_code}")

        await asyncio.gather(*(sender() for _ in range(64)))
    finally:
        await rx.store.close()


def _drain(
    url: str,
    env: dict[str, str],
    handler: str,
    seconds: float,
    work: Path,
    backlog: tuple[load.Ids, load.Template],
) -> float:
    """Deliveries per second of one worker process, over ``seconds`` once it has started.

    The queue is topped up first, with enough for ``seconds`` at a generous rate: a drain
    that found the queue empty (a short ingest, or an earlier drain that took it all) would
    wait for a first completion that never comes."""
    wanted = int(seconds * 5_000)
    missing = wanted - _receipts(url, "queued")
    if missing > 0:
        asyncio.run(_enqueue(url, missing, *backlog))
    log = (work / f"worker-{handler}.log").open("wb")
    process = subprocess.Popen(
        [
            RECEIVER,
            "worker",
            "--app",
            "benchmarks.app:app",
            "--concurrency",
            "32",
            "--log-level",
            "warning",
        ],
        env={**os.environ, **env, "BENCH_HANDLER": handler},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        start_count = _receipts(url, "completed")
        deadline = time.monotonic() + 30
        while _receipts(url, "completed") == start_count:  # wait for its first completion
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the worker did not start: {(work / log.name).read_text()}")
            time.sleep(0.05)
        began, first = time.monotonic(), _receipts(url, "completed")
        while time.monotonic() - began < seconds and _receipts(url, "queued"):
            time.sleep(0.25)
        done, elapsed = _receipts(url, "completed") - first, time.monotonic() - began
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        log.close()
    return round(done / elapsed, 1)


def run(
    pg_url: str,
    *,
    rounds: int = 2,
    duration: int = 4,
    connections: int = 64,
    drain_seconds: float = 8.0,
    work: Path | None = None,
) -> dict[str, Any]:
    owned = work is None
    work = Path(tempfile.mkdtemp(prefix="bench-queued-")) if work is None else work
    work.mkdir(parents=True, exist_ok=True)
    target = PostgresTarget(pg_url)
    target.prepare()
    invocations = work / "invocations"
    invocations.mkdir(exist_ok=True)
    env = {"BENCH_STORE": pg_url, "BENCH_SECRET": SECRET, "BENCH_INVOCATIONS": str(invocations)}
    ids = load.Ids(f"q{os.getpid() % 10000}")
    template = load.Template.make(1024, ids.length)
    signer = load.Signer(SECRET)
    side: dict[str, list[load.WrkResult]] = {"queued": [], "inline": [], "bare": []}
    logs: list[Path] = []
    started = [
        servers.Server("bare", "benchmarks.bare", workers=1, env={}, log=work / "bare.log"),
        servers.Server("inline", "benchmarks.app", workers=1, env=env, log=work / "inline.log"),
        servers.Server(
            "queued",
            "benchmarks.app",
            workers=1,
            env={**env, "BENCH_MODE": "queued"},
            log=work / "queued.log",
        ),
    ]
    try:
        rate = 20_000.0
        for n in range(rounds + 1):  # round 0 warms every server up
            for server in started:
                fresh = ids.take(int(rate * duration * 2) + 1000)
                data = load.write_deliveries(
                    work / f"{server.name}{n}.ids", fresh, template, signer
                )
                log = work / f"{server.name}{n}"
                result = _measure(server, data, log, work, duration, connections, template)
                if n:
                    side[server.name].append(result)
                    if server.name == "queued":
                        logs += result.logs
    finally:
        for server in started:
            server.stop()
    seen = checks.observe([])
    statuses: dict[int, int] = {}
    for status, _, _ in load.read_logs(logs):
        statuses[status] = statuses.get(status, 0) + 1
    queued = _receipts(pg_url, "queued")
    figures = {name: _summary(runs) for name, runs in side.items()}
    result: dict[str, Any] = {
        "ingest": figures,
        "ratio_to_bare": round(figures["queued"]["rps"] / figures["bare"]["rps"], 3),
        "ratio_to_inline": round(figures["queued"]["rps"] / figures["inline"]["rps"], 2),
        "queued_statuses": statuses,
        "queued_receipts": queued,
    }
    drain_env = {**env, "BENCH_MODE": "queued"}
    backlog = (ids, template)
    result["drain_noop_per_s"] = _drain(pg_url, drain_env, "noop", drain_seconds, work, backlog)
    result["drain_insert_per_s"] = _drain(pg_url, drain_env, "insert", drain_seconds, work, backlog)
    counts = checks.invocations(invocations)
    doubles = sum(1 for n in counts.values() if n > 1)
    rows = asyncio.run(
        _count(
            pg_url,
            f"SELECT count(*) FROM (SELECT webhook_id FROM {BUSINESS_TABLE} "  # noqa: S608
            "GROUP BY webhook_id HAVING count(*) > 1) d",
        )
    )
    acknowledged = sum(n for s, n in statuses.items() if s == 202)
    recorded = asyncio.run(
        _count(pg_url, "SELECT count(*) FROM receiver_receipts WHERE due_at IS NOT NULL")
    )
    result["double_executions"] = doubles + rows
    result["ok"] = doubles + rows == 0 and recorded >= acknowledged and not seen.bad_bodies
    if owned:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return result


def describe(r: dict[str, Any]) -> str:
    i = r["ingest"]
    return (
        f"queued ingest {i['queued']['rps']:,.0f} req/s (p50 {i['queued']['p50_ms']} ms, p99 "
        f"{i['queued']['p99_ms']} ms): {r['ratio_to_bare']:.2f} of bare "
        f"({i['bare']['rps']:,.0f}), {r['ratio_to_inline']:.1f}x the inline fresh path "
        f"({i['inline']['rps']:,.0f}); worker drain {r['drain_noop_per_s']:,.0f}/s no-op, "
        f"{r['drain_insert_per_s']:,.0f}/s insert, per worker process; double executions "
        f"{r['double_executions']}; checks {'ok' if r['ok'] else 'FAILED'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.queued", description=__doc__)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args(argv)
    result = run(
        args.pg_url, rounds=args.rounds, duration=args.duration, connections=args.connections
    )
    print(describe(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
