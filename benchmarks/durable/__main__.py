"""``python -m benchmarks.durable``: the side-by-side experiment for every durable runtime.

For DBOS, Prefect and Pydantic AI's durable agents (on DBOS): N runs with the runtime alone and
N with the executor under the step, interleaved, each killed (SIGKILL) after the refund and
before the runtime recorded the step, then recovered by the runtime's own mechanism; the fake
payment service counts each order's refunds. Then the step's latency, each side M times,
interleaved in one process per runtime. Prints both tables and writes
``benchmarks/results/durable.json``. The database of ``--pg-url`` is dropped and created again.

    python -m benchmarks.durable --runs 10 --latency 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from receiver import PostgresStore

from ..agents import fresh_pg
from .experiment import Experiment, Runtime, side_by_side, summary
from .prefect_server import prefect_server

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_durable"
RUNTIMES = ("dbos", "prefect", "pydantic-ai")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "durable.json"


def runtimes(db: str, prefect_env: dict[str, str]) -> dict[str, Runtime]:
    return {
        "dbos": Runtime("dbos", "benchmarks.durable.dbos_worker", ("--db", db)),
        "prefect": Runtime(
            "prefect", "benchmarks.durable.prefect_worker", ("--db", db), prefect_env
        ),
        "pydantic-ai": Runtime(
            "pydantic-ai", "benchmarks.durable.pydantic_ai_worker", ("--db", db)
        ),
    }


async def measure(
    db: str, prefect_env: dict[str, str], names: list[str], runs: int, latency: int, work: Path
) -> list[dict[str, Any]]:
    await fresh_pg(db)
    async with PostgresStore(db) as store:
        await store.migrate()
    rows: list[dict[str, Any]] = []
    async with Experiment(work) as experiment:
        for name in names:
            runtime = runtimes(db, prefect_env)[name]
            began = time.perf_counter()
            done = await side_by_side(experiment, runtime, runs)
            samples = await experiment.latency(runtime, latency) if latency else None
            for row in summary(name, done, samples):
                row["step"] = "agent run" if name == "pydantic-ai" else "step"
                rows.append(row)
            print(f"{name}: done in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| runtime | side | runs | runs with a duplicate refund | duplicate refunds "
        "| latency p50 (ms) | p95 (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        side = "alone" if r["side"] == "alone" else "with the executor"
        p50 = f"{r['step_p50_ms']:.1f}" if "step_p50_ms" in r else "-"
        p95 = f"{r['step_p95_ms']:.1f}" if "step_p95_ms" in r else "-"
        lines.append(
            f"| {r['runtime']} | {side} | {r['runs']} | {r['runs_with_duplicate']} "
            f"| {r['duplicate_refunds']} | {p50} | {p95} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    parser.add_argument("--runs", type=int, default=10, help="crash runs per side and runtime")
    parser.add_argument("--latency", type=int, default=50, help="timed steps per side (0: none)")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()
    names = [n for n in args.runtimes.split(",") if n]
    unknown = set(names) - set(RUNTIMES)
    if unknown:
        parser.error(f"unknown runtimes {sorted(unknown)}; choose from {list(RUNTIMES)}")
    with tempfile.TemporaryDirectory(prefix="receiver-durable-") as tmp:
        work = Path(tmp)
        # Prefect's API server takes a while to start (its migrations): only when it runs.
        server = prefect_server(work / "prefect") if "prefect" in names else nullcontext({})
        with server as prefect_env:
            rows = asyncio.run(
                measure(args.pg_url, prefect_env, names, args.runs, args.latency, work)
            )
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "rows": rows,
                "runs": args.runs,
                "latency_samples": args.latency,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            },
            indent=2,
        )
    )
    # A correctness check, not a timing: the executor's side must never refund twice.
    return 1 if any(r["side"] == "executor" and r["duplicate_refunds"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
