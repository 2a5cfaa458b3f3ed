"""What the idempotency proxy adds to a call (``python -m benchmarks.proxy``).

Two uvicorn servers on loopback (one worker each, uvloop and httptools): a JSON upstream
(benchmarks/proxy_upstream.py) and ``IdempotencyProxy`` in front of it with its defaults
(benchmarks/proxy_app.py) on PostgreSQL (``--pg-url``; its database is dropped and created) or
SQLite (``--store sqlite``). One client sends requests one after another over a kept-alive
connection, in interleaved rounds of each side:

- ``direct``: POST to the upstream itself;
- ``fresh``: POST through the proxy under an Idempotency-Key never sent before (claimed,
  forwarded, stored);
- ``replay``: POST through the proxy with a key already answered (the stored answer);
- ``pass``: POST through the proxy without a key (streamed through, nothing stored).

Prints p50/p99 per side and what the proxy adds over ``direct``; then checks that the upstream
was called once per fresh key and never for a replay. Figures only, no timing assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from . import servers
from .agents import fresh_pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench_proxy"
SIDES = ("direct", "fresh", "replay", "pass")
BODY = b'{"amount":1200,"currency":"usd","customer":"cus_0000000001"}'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(store: str, rounds: int, requests: int, tmp: Path) -> dict[str, list[float]]:
    upstream = servers.Server(
        "upstream", "benchmarks.proxy_upstream", workers=1, env={}, log=tmp / "upstream.log"
    )
    proxy = servers.Server(
        "proxy",
        "benchmarks.proxy_app",
        workers=1,
        env={"BENCH_UPSTREAM": upstream.url(""), "BENCH_STORE": store},
        log=tmp / "proxy.log",
    )
    timings: dict[str, list[float]] = {side: [] for side in SIDES}
    keys = (f"bench-{uuid.uuid4().hex[:8]}-{i}" for i in itertools.count())
    headers = {"content-type": "application/json"}
    try:
        with httpx.Client() as direct, httpx.Client() as through:
            answered = next(keys)
            through.post(
                proxy.url("/payments"),
                content=BODY,
                headers={**headers, "idempotency-key": answered},
            )
            for _ in range(rounds):
                for side in SIDES:
                    client = direct if side == "direct" else through
                    url = (upstream if side == "direct" else proxy).url("/payments")
                    for _ in range(requests):
                        extra = {}
                        if side == "fresh":
                            extra = {"idempotency-key": next(keys)}
                        elif side == "replay":
                            extra = {"idempotency-key": answered}
                        began = time.perf_counter()
                        got = client.post(url, content=BODY, headers={**headers, **extra})
                        timings[side].append(time.perf_counter() - began)
                        if got.status_code != 201:
                            raise RuntimeError(f"{side}: {got.status_code} {got.text[:200]}")
            upstream_calls = int(direct.get(upstream.url("/count")).text)
        # Every direct, pass and fresh request reached the upstream once; replays never did.
        expected = 1 + rounds * requests * 3
        print(f"upstream calls: {upstream_calls} (expected {expected}: replays never forwarded)")
        if upstream_calls != expected:
            raise SystemExit("correctness check failed: the upstream was called a wrong number")
    finally:
        proxy.stop()
        upstream.stop()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="per side and round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as directory:
        tmp = Path(directory)
        if args.store == "postgresql":
            asyncio.run(fresh_pg(args.pg_url))
            store = args.pg_url
        else:
            store = f"sqlite:///{tmp / 'proxy.db'}"
        subprocess.run(
            [str(Path(sys.executable).parent / "receiver"), "migrate", "--store", store],
            check=True,
            capture_output=True,
        )
        timings = run(store, args.rounds, args.requests, tmp)
    direct50 = statistics.median(timings["direct"])
    direct99 = percentile(timings["direct"], 0.99)
    print(
        f"store {args.store}, {args.rounds} rounds x {args.requests} requests per side, "
        "one client, sequential"
    )
    print(f"{'side':8} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10}")
    for side in SIDES:
        p50 = statistics.median(timings[side])
        p99 = percentile(timings[side], 0.99)
        print(
            f"{side:8} {p50 * 1e3:8.2f} {p99 * 1e3:8.2f} "
            f"{(p50 - direct50) * 1e3:10.2f} {(p99 - direct99) * 1e3:10.2f}"
        )


if __name__ == "__main__":
    main()
