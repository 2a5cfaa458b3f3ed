"""The runner: ``python -m benchmarks [--quick]``. See benchmarks/README.md."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from receiver import generate_secret

from . import (
    agents,
    checks,
    dbos_peer,
    keyed_http,
    load,
    overload,
    peers,
    profile,
    queued,
    report,
    servers,
    tracing,
    verifier,
)
from .business import PROVIDER
from .stores import PostgresTarget, SQLiteTarget, Target

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_bench"
NOISY = 0.25  # cores used by other processes during a round that make its figures suspect


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str  # fresh | replay | mixed | forged
    handler: str = "noop"  # noop | insert
    workers: int = 1


SCENARIOS = (
    Scenario("fresh-noop", "fresh deliveries, no-op transactional handler", "fresh"),
    Scenario(
        "fresh-insert", "fresh deliveries, handler inserts one row through tx", "fresh", "insert"
    ),
    Scenario("replay", "100% redeliveries of completed receipts", "replay"),
    Scenario("mixed", "50% redeliveries of completed receipts, 50% fresh", "mixed"),
    Scenario("forged", "forged signatures (rejected before the store)", "forged"),
    Scenario(
        "workers2",
        "fresh deliveries, no-op handler, 2 uvicorn workers (both sides)",
        "fresh",
        workers=2,
    ),
)
# The targets (ratios to the bare endpoint): shown next to the figures, never asserted.
TARGETS = {
    ("fresh-noop", "postgresql"): 0.40,
    ("replay", "postgresql"): 0.65,
    ("forged", "postgresql"): 0.80,
    ("fresh-noop", "sqlite"): 0.35,
}


@dataclass(frozen=True)
class Settings:
    duration: int = 4  # seconds per measured round, each side
    rounds: int = 2  # measured rounds per side, interleaved receiver, bare, receiver, bare...
    warmup: int = 2  # seconds of warm-up of each new server
    seed: int = 3  # seconds of fresh deliveries that give the redelivery scenarios their ids
    connections: int = 64
    threads: int = 1
    body: int = 1024
    soak: int = 300  # seconds; 0 skips the soak
    soak_chunk: int = 60  # seconds per wrk run of the soak (each is signed just before it)
    soak_store: str = "postgresql"
    verifier: float = 10.0  # seconds of the verifier micro-benchmark; 0 skips it
    agents: float = 5.0  # seconds per side of the middleware/executor benchmark; 0 skips it
    tracing: int = 5  # rounds of the tracing micro-benchmark; 0 skips it
    queued: int = 2  # rounds of the queued-mode benchmark (PostgreSQL); 0 skips it
    peers: int = 2  # rounds against pgqueuer and procrastinate (PostgreSQL); 0 skips it
    peer_seconds: float = 5.0  # seconds of each side's drain per round
    dbos: int = 2  # rounds of the executor against DBOS workflows (PostgreSQL); 0 skips it
    dbos_seconds: float = 4.0  # seconds per side, mode and round
    keyed_http: int = 2  # rounds of the Idempotency-Key middleware over HTTP; 0 skips it
    profile_seconds: int = 20


FULL = Settings()
QUICK = Settings(
    duration=2,
    rounds=1,
    warmup=1,
    seed=1,
    soak=10,
    soak_chunk=10,
    verifier=2.0,
    tracing=1,
    agents=1.0,
    queued=1,
    peers=1,
    peer_seconds=2.0,
    dbos=1,
    dbos_seconds=2.0,
    keyed_http=1,
)


@dataclass
class Run:
    """A wrk run and what it cost the server and the database."""

    wrk: load.WrkResult
    server_cpu: float
    db_cpu: float
    machine_cpu: float  # every process on the machine

    @property
    def other_cpu(self) -> float:
        """CPU time of processes other than the server, the database and wrk: noise."""
        return max(0.0, self.machine_cpu - self.server_cpu - self.db_cpu - self.wrk.cpu_seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.wrk.as_dict(),
            "server_cpu_s": round(self.server_cpu, 3),
            "db_cpu_s": round(self.db_cpu, 3),
            "other_cpu_s": round(self.other_cpu, 3),
        }


@dataclass
class Bench:
    """Everything one invocation of the runner shares: settings, ids, servers, files."""

    settings: Settings
    work: Path
    pg_url: str
    secret: str = field(default_factory=generate_secret)
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    max_rate: float = 0.0  # the highest req/s seen yet: sizes the pools of fresh ids
    wait_quiet: float = 0.0  # seconds to wait for an idle machine before each scenario
    receiver_log: bool = False  # the receiver logs one INFO line per delivery to a file
    failures: list[str] = field(default_factory=list)
    _bare: dict[int, servers.Server] = field(default_factory=dict)
    _counter: int = 0

    @property
    def database(self) -> str:
        return self.pg_url.rsplit("/", 1)[-1].split("?", 1)[0]

    def __post_init__(self) -> None:
        self.ids = load.Ids(self.run_id)
        self.template = load.Template.make(self.settings.body, self.ids.length)
        self.signer = load.Signer(self.secret)

    def path(self, name: str) -> Path:
        self._counter += 1
        return self.work / f"{self._counter:04d}-{name}"

    # -- servers -------------------------------------------------------------------------------

    def bare(self, workers: int) -> servers.Server:
        """The bare endpoint with ``workers`` workers: started (and warmed up) once per run."""
        if workers not in self._bare:
            server = servers.Server(
                f"bare-{workers}w",
                "benchmarks.bare",
                workers=workers,
                env={},
                log=self.path(f"bare-{workers}w.log"),
            )
            self._bare[workers] = server
            self.measure(server, self.filler(), "bare-warmup", self.settings.warmup)
        return self._bare[workers]

    def receiver(self, target: Target, scenario: Scenario, invocations: Path) -> servers.Server:
        return servers.Server(
            f"receiver-{scenario.name}-{target.name}",
            "benchmarks.app",
            workers=scenario.workers,
            env={
                "BENCH_STORE": target.url,
                "BENCH_SECRET": self.secret,
                "BENCH_HANDLER": scenario.handler,
                "BENCH_INVOCATIONS": str(invocations),
                # No admission bound: the scenarios measure how fast the pipeline answers 64
                # connections beside sides that queue every request (the bare endpoint, the
                # hand-written receivers); a delivery shed with 503 would count as throughput.
                # Shedding has a benchmark of its own (benchmarks/overload.py).
                "BENCH_ADMISSION": "0",
                **(
                    {"BENCH_LOG": str(self.path(f"log-{scenario.name}-{target.name}.txt"))}
                    if self.receiver_log
                    else {}
                ),
            },
            log=self.path(f"receiver-{scenario.name}-{target.name}.log"),
        )

    def close(self) -> None:
        for server in self._bare.values():
            server.stop()

    # -- deliveries ----------------------------------------------------------------------------

    def deliveries(self, name: str, ids: Sequence[str], *, forged: bool = False) -> Path:
        return load.write_deliveries(
            self.path(name + ".ids"), ids, self.template, self.signer, forged=forged
        )

    def fresh_count(self, seconds: int, share: float = 1.0) -> int:
        """Enough fresh ids for ``seconds`` at the highest rate seen yet, with a margin."""
        rate = self.max_rate or 20_000.0
        return int(rate * seconds * share * 2) + 4 * self.settings.connections + 1000

    def filler(self) -> Path:
        """Deliveries for runs whose ids do not matter (the bare endpoint ignores them)."""
        return self.deliveries("filler", self.ids.take(5000))

    # -- measuring -----------------------------------------------------------------------------

    def measure(
        self,
        server: servers.Server,
        data: Path,
        label: str,
        seconds: int,
    ) -> Run:
        s = self.settings
        log = self.path(label)
        script = load.write_script(
            self.path(label + ".lua"),
            data=data,
            log=log,
            port=server.port,
            target=f"/{PROVIDER}",
            template=self.template,
            threads=s.threads,
        )
        db = servers.postgres_pids(self.database) if server.name.endswith("postgresql") else []
        server_before, db_before = server.cpu_seconds(), servers.cpu_seconds(db)
        machine_before = servers.machine_busy_seconds()
        wrk = load.run_wrk(
            server.url(f"/{PROVIDER}"),
            script,
            log,
            duration=seconds,
            connections=s.connections,
            threads=s.threads,
        )
        run = Run(
            wrk,
            server.cpu_seconds() - server_before,
            servers.cpu_seconds(db) - db_before,
            servers.machine_busy_seconds() - machine_before,
        )
        self.max_rate = max(self.max_rate, wrk.rps)
        return run


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _summary(runs: list[Run]) -> dict[str, Any]:
    requests = sum(r.wrk.requests for r in runs)
    seconds = sum(r.wrk.seconds for r in runs)
    return {
        "rps": round(requests / seconds, 1) if seconds else 0.0,
        "p50_ms": round(statistics.median(r.wrk.latency_us["p50"] for r in runs) / 1000, 3),
        "p99_ms": round(statistics.median(r.wrk.latency_us["p99"] for r in runs) / 1000, 3),
        "requests": requests,
        "rounds": [r.as_dict() for r in runs],
    }


def _per_request(runs: list[Run]) -> dict[str, float]:
    requests = sum(r.wrk.requests for r in runs) or 1
    seconds = sum(r.wrk.seconds for r in runs) or 1
    server = sum(r.server_cpu for r in runs)
    db = sum(r.db_cpu for r in runs)
    client = sum(r.wrk.cpu_seconds for r in runs)
    other = sum(r.other_cpu for r in runs)
    return {
        "server_us_per_req": round(server / requests * 1e6, 1),
        "db_us_per_req": round(db / requests * 1e6, 1),
        "wrk_us_per_req": round(client / requests * 1e6, 1),
        "server_cores": round(server / seconds, 2),
        "db_cores": round(db / seconds, 2),
        "wrk_cores": round(client / seconds, 2),
        "other_cores": round(other / seconds, 2),
    }


class Scene:
    """One scenario on one store: its server, its seeded ids and every run against it."""

    def __init__(self, bench: Bench, scenario: Scenario, target: Target) -> None:
        self.bench = bench
        self.scenario = scenario
        self.target = target
        self.invocations = bench.path(f"invocations-{scenario.name}-{target.name}")
        self.invocations.mkdir()
        self.logs: list[Path] = []  # every run against the receiver, for the checks
        self.seed_logs: list[Path] = []
        self.seeded: list[str] = []
        self.fresh_requests = 0
        self.fresh_ids = 0
        self.wrapped = False

    def data(self, label: str, seconds: int) -> Path:
        """Deliveries for one run of ``seconds`` of this scenario, signed now."""
        b, kind = self.bench, self.scenario.kind
        if kind == "replay":
            ids = random.sample(self.seeded, len(self.seeded))
            return b.deliveries(label, ids)
        if kind == "forged":
            return b.deliveries(label, b.ids.take(b.fresh_count(seconds)), forged=True)
        if kind == "mixed":
            fresh = b.ids.take(b.fresh_count(seconds, 0.5))
            ids = [
                x
                for pair in zip(fresh, random.choices(self.seeded, k=len(fresh)), strict=True)
                for x in pair
            ]
            return b.deliveries(label, ids)
        return b.deliveries(label, b.ids.take(b.fresh_count(seconds)))

    def run(self, server: servers.Server, label: str, seconds: int) -> Run:
        data = self.data(label, seconds)
        run = self.bench.measure(server, data, label, seconds)
        self.logs.extend(run.wrk.logs)
        if self.scenario.kind in ("fresh", "mixed"):
            lines = _lines(data)
            share = 1.0 if self.scenario.kind == "fresh" else 0.5
            # Requests still in flight when wrk stops were sent too: count the connections.
            sent = run.wrk.requests + run.wrk.errors["timeout"] + self.bench.settings.connections
            self.wrapped |= sent > lines
            self.fresh_requests += int(sent * share)
            self.fresh_ids += int(lines * share)
        return run

    def seed(self, server: servers.Server) -> None:
        """Fresh deliveries whose answered ids the redelivery scenarios then redeliver."""
        if self.scenario.kind not in ("replay", "mixed"):
            return
        b = self.bench
        data = b.deliveries("seed", b.ids.take(b.fresh_count(b.settings.seed)))
        run = b.measure(server, data, "seed", b.settings.seed)
        self.logs.extend(run.wrk.logs)
        self.seed_logs.extend(run.wrk.logs)
        self.seeded = sorted(checks.observe(run.wrk.logs).ok_ids)
        if not self.seeded:
            raise RuntimeError(f"seeding {self.scenario.name} on {self.target.name}: no 2xx")

    def verdict(self) -> checks.Verdict:
        verdict = checks.check(
            kind=self.scenario.kind,
            handler=self.scenario.handler,
            seen=checks.observe(self.logs),
            measured=checks.observe(x for x in self.logs if x not in self.seed_logs),
            calls=checks.invocations(self.invocations),
            ledger=self.target.snapshot(),
            expected_status=401 if self.scenario.kind == "forged" else 200,
        )
        if self.wrapped:
            verdict.warnings.append(
                "the pool of fresh ids wrapped around: some 'fresh' deliveries were redeliveries"
            )
        return verdict


def _target(bench: Bench, store: str) -> Target:
    if store == "postgresql":
        return PostgresTarget(bench.pg_url)
    return SQLiteTarget(bench.work / "bench.db")


def _say(message: str) -> None:
    print(message, flush=True)


def busy_cores(seconds: float = 1.0) -> float:
    """Cores in use by the whole machine over ``seconds`` (call it when nothing of ours runs)."""
    before = servers.machine_busy_seconds()
    time.sleep(seconds)
    return (servers.machine_busy_seconds() - before) / seconds


def _per_answer(before: dict[str, int], after: dict[str, int], answers: int) -> dict[str, float]:
    return {
        f"{k}_per_request": round((after[k] - before.get(k, 0)) / max(1, answers), 2) for k in after
    }


def _statements(target: Any) -> dict[str, dict[str, float]] | None:
    return target.statements() if isinstance(target, PostgresTarget) else None


def _statements_per_answer(
    before: dict[str, dict[str, float]] | None,
    after: dict[str, dict[str, float]] | None,
    answers: int,
) -> dict[str, dict[str, float]] | None:
    """What each statement cost PostgreSQL per answered request over the scenario's runs
    (warm-up included): calls, execution microseconds, WAL bytes, buffers."""
    if before is None or after is None:
        return None
    per: dict[str, dict[str, float]] = {}
    n = max(1, answers)
    for name, now in after.items():
        was = before.get(name, {})
        calls = now["calls"] - was.get("calls", 0)
        if calls / n < 0.01:  # the runner's own queries, start-up, the sweeper's rare passes
            continue
        per[name] = {
            "calls": round(calls / n, 3),
            "exec_us": round((now["exec_ms"] - was.get("exec_ms", 0.0)) * 1000 / n, 1),
            "wal_bytes": round((now["wal_bytes"] - was.get("wal_bytes", 0)) / n),
            "blocks": round((now["blocks"] - was.get("blocks", 0)) / n, 1),
        }
    return dict(sorted(per.items(), key=lambda kv: -kv[1]["exec_us"]))


def _index_warnings(per_request: dict[str, float], verdict: checks.Verdict) -> None:
    """A delivery touches a handful of index entries; hundreds mean a plan walks an index."""
    for key, value in per_request.items():
        if (key.startswith(("idx_tup_read:", "seq_tup_read:"))) and value > 100:
            name = key.split(":", 1)[1].removesuffix("_per_request")
            verdict.warnings.append(
                f"PostgreSQL read {value:,.0f} entries of {name} per request: some statement's "
                "plan scans it instead of looking its key up"
            )


def wait_quiet(limit: float) -> None:
    """Wait (up to ``limit`` seconds) until the machine is nearly idle: other work on a 2-core
    machine (a test suite, a build) changes the figures more than anything measured here."""
    deadline = time.monotonic() + limit
    while True:
        busy = busy_cores()
        if busy < NOISY or time.monotonic() >= deadline:
            if busy >= NOISY:
                _say(f"  (machine still busy: {busy:.2f} cores in use by other processes)")
            return


# The receivers people write by hand (benchmarks/handwritten.py), measured beside the receiver
# in every fresh one-worker scenario: the guarantees should not cost more than these. SQLite's
# "sqlite_serial" is the same receiver holding its connection for the whole delivery: kept to
# show what that one choice costs (see docs/performance/webhooks.md).
REFERENCES = {"postgresql": ("pg2", "pg1"), "sqlite": ("sqlite", "sqlite_serial")}


def hand_servers(bench: Bench, scenario: Scenario, target: Target) -> dict[str, servers.Server]:
    """The hand-written receivers of the store (not started): measured in the same rounds as
    the receiver, one after another, so that each pair meets the same noise."""
    if scenario.kind != "fresh" or scenario.workers != 1:
        return {}
    found: dict[str, servers.Server] = {}
    for kind in REFERENCES[target.name]:
        url = bench.pg_url if target.name == "postgresql" else str(bench.path(f"hand-{kind}.db"))
        found[kind] = servers.Server(
            f"hand-{kind}-{scenario.name}-{target.name}",
            "benchmarks.handwritten",
            workers=1,
            env={
                "HAND_KIND": kind,
                "HAND_STORE": url,
                "HAND_SECRET": bench.secret,
                "HAND_HANDLER": scenario.handler,
            },
            log=bench.path(f"hand-{kind}-{scenario.name}.log"),
        )
    return found


def references(
    scenario: Scenario,
    target: Target,
    runs: dict[str, list[Run]],
    bare_runs: list[Run],
    rx_runs: list[Run],
) -> dict[str, dict[str, Any]]:
    """Each hand-written receiver's figures, from the rounds it shared with the receiver."""
    found: dict[str, dict[str, Any]] = {}
    b = _summary(bare_runs)
    for kind, hand_runs in runs.items():
        hand = _summary(hand_runs)
        seen = checks.observe(log for r in hand_runs for log in r.wrk.logs)
        pairs = [
            r.wrk.rps / h.wrk.rps for r, h in zip(rx_runs, hand_runs, strict=True) if h.wrk.rps
        ]
        found[kind] = {
            **hand,
            "bare_rps": b["rps"],
            "ratio": round(hand["rps"] / b["rps"], 3) if b["rps"] else 0.0,
            # the receiver's req/s over this one's, round by round (same noise within a round)
            "vs_range": [round(min(pairs), 2), round(max(pairs), 2)] if pairs else None,
            "cpu": _per_request(hand_runs),
            "statuses": {str(k): v for k, v in sorted(seen.statuses.items())},
        }
        if seen.answers != seen.ok:
            _say(f"    warning: hand-written {kind} answered {dict(seen.statuses)}")
        _say(
            f"  {target.name:<10} {scenario.name:<13} hand-written {kind:<13} "
            f"{hand['rps']:>8,.0f} req/s  p50 {hand['p50_ms']:6.2f} ms  "
            f"p99 {hand['p99_ms']:6.2f} ms  srv {found[kind]['cpu']['server_us_per_req']:6.0f}"
            f" us/req | receiver vs it, by round: {found[kind]['vs_range']}"
        )
    return found


def run_scenario(bench: Bench, scenario: Scenario, store: str) -> dict[str, Any]:
    s = bench.settings
    if bench.wait_quiet:
        wait_quiet(bench.wait_quiet)
    target = _target(bench, store)
    target.prepare()
    bare = bench.bare(scenario.workers)
    scene = Scene(bench, scenario, target)
    stats_before = target.stats()
    statements_before = _statements(target)
    rx_runs: list[Run] = []
    bare_runs: list[Run] = []
    hand_runs: dict[str, list[Run]] = {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(bench.receiver(target, scenario, scene.invocations))
        hands = {
            kind: stack.enter_context(h)
            for kind, h in hand_servers(bench, scenario, target).items()
        }
        scene.seed(server)
        scene.run(server, "warmup", s.warmup)
        for kind, hand in hands.items():
            fresh = bench.ids.take(bench.fresh_count(s.warmup))
            bench.measure(hand, bench.deliveries(f"hand-{kind}-warmup", fresh), "hw", s.warmup)
            hand_runs[kind] = []
        # Interleaved: the receiver, each hand-written receiver, the bare endpoint, again.
        for n in range(1, s.rounds + 1):
            rx_runs.append(scene.run(server, f"rx-r{n}", s.duration))
            for kind, hand in hands.items():
                label = f"hand-{kind}-r{n}"
                data = bench.deliveries(label, bench.ids.take(bench.fresh_count(s.duration)))
                hand_runs[kind].append(bench.measure(hand, data, label, s.duration))
            bare_runs.append(bench.measure(bare, bench.filler(), f"bare-r{n}", s.duration))
        rss, hwm = server.memory_kib()
    verdict = scene.verdict()
    stats_after = target.stats()
    statements = _statements_per_answer(
        statements_before, _statements(target), verdict.counts["answers"]
    )
    refs = references(scenario, target, hand_runs, bare_runs, rx_runs)
    answers = verdict.counts["answers"]
    db_per_request = _per_answer(stats_before, stats_after, answers)
    _index_warnings(db_per_request, verdict)
    noise = max(r.other_cpu / r.wrk.seconds for r in [*rx_runs, *bare_runs])
    if noise > NOISY:
        verdict.warnings.append(
            f"other processes used up to {noise:.2f} cores during a round: the machine was not "
            "quiet, the figures are noisy"
        )
    rx, b = _summary(rx_runs), _summary(bare_runs)
    ratios = [r.wrk.rps / x.wrk.rps for r, x in zip(rx_runs, bare_runs, strict=True) if x.wrk.rps]
    result = {
        "name": scenario.name,
        "store": store,
        "title": scenario.title,
        "kind": scenario.kind,
        "handler": scenario.handler,
        "workers": scenario.workers,
        "receiver": rx,
        "bare": b,
        "ratio": round(rx["rps"] / b["rps"], 3) if b["rps"] else 0.0,
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
        "target": TARGETS.get((scenario.name, store)),
        # The hand-written receivers of the same store, same run; "vs" is the receiver's req/s
        # over theirs (a figure above 1: the receiver is faster).
        "references": refs,
        "vs_hand": {k: round(rx["rps"] / v["rps"], 2) for k, v in refs.items() if v["rps"]},
        "cpu": _per_request(rx_runs),
        "bare_cpu": _per_request(bare_runs),
        "memory": {"server_rss_kib": rss, "server_peak_rss_kib": hwm},
        # PostgreSQL's counters over every run of the scenario, per answered request
        "db_per_request": db_per_request,
        # pg_stat_statements per statement, per answered request (where the server loads it)
        "statements_per_request": statements,
        "seeded_ids": len(scene.seeded),
        "checks": {
            "failures": verdict.failures,
            "warnings": verdict.warnings,
            **verdict.counts,
        },
    }
    status = "FAILED" if verdict.failures else "ok"
    _say(
        f"  {store:<10} {scenario.name:<13} {rx['rps']:>8,.0f} req/s  p50 {rx['p50_ms']:6.2f} ms  "
        f"p99 {rx['p99_ms']:6.2f} ms  | bare {b['rps']:>8,.0f}  ratio {result['ratio']:.2f}  "
        f"checks {status}"
    )
    for line in verdict.failures:
        _say(f"    FAILURE: {line}")
        bench.failures.append(f"{store}/{scenario.name}: {line}")
    for line in verdict.warnings:
        _say(f"    warning: {line}")
    return result


def soak(bench: Bench) -> dict[str, Any]:
    """Fresh deliveries (handler inserting a row) mixed 50/50 with redeliveries of ids completed
    earlier in the soak, for ``--soak`` seconds, sampling the server's RSS every second."""
    s = bench.settings
    scenario = Scenario("soak", "soak", "mixed", handler="insert")
    target = _target(bench, s.soak_store)
    target.prepare()
    scene = Scene(bench, scenario, target)
    stats_before = target.stats()
    chunks = []
    with (
        bench.receiver(target, scenario, scene.invocations) as server,
        servers.MemorySampler(server) as sampler,
    ):
        started = time.monotonic()
        seed_rate = bench.max_rate
        bench.max_rate = 5000.0  # size the seed for a receiver, not for the bare endpoint
        scene.seed(server)
        remaining = s.soak
        n = 0
        while remaining > 0:
            n += 1
            seconds = min(s.soak_chunk, remaining)
            run = scene.run(server, f"soak-{n}", seconds)
            scene.seeded.extend(checks.observe(run.wrk.logs).ok_ids)
            rss, _ = server.memory_kib()
            chunks.append(
                {
                    **run.as_dict(),
                    "end_s": round(time.monotonic() - started, 1),
                    "rss_kib": rss,
                }
            )
            _say(
                f"  soak chunk {n}: {run.wrk.rps:,.0f} req/s, p99 "
                f"{run.wrk.latency_us['p99'] / 1000:.2f} ms, RSS {rss / 1024:.1f} MiB"
            )
            remaining -= seconds
        _, peak = server.memory_kib()
        bench.max_rate = max(bench.max_rate, seed_rate)
    verdict = scene.verdict()
    db_per_request = _per_answer(stats_before, target.stats(), verdict.counts["answers"])
    _index_warnings(db_per_request, verdict)
    samples = sampler.samples
    series = [kib for _, kib in samples]
    half = series[len(series) // 2 :] or series
    result = {
        "store": s.soak_store,
        "description": "50% fresh (insert handler), 50% redeliveries",
        "seconds": s.soak,
        "peak_rss_mib": round(peak / 1024, 1),
        "rss_start_mib": round(series[min(len(series) - 1, 5)] / 1024, 1) if series else 0.0,
        "rss_mid_mib": round(half[0] / 1024, 1) if half else 0.0,
        "rss_end_mib": round(series[-1] / 1024, 1) if series else 0.0,
        "requests": sum(c["requests"] for c in chunks),
        "chunks": chunks,
        "rss_samples": [(round(t, 1), kib) for t, kib in samples],
        "db_per_request": db_per_request,
        "checks": {"failures": verdict.failures, "warnings": verdict.warnings, **verdict.counts},
    }
    _say(
        f"  soak: {result['requests']:,} requests in {s.soak} s; RSS {result['rss_start_mib']} MiB "
        f"at start, {result['rss_mid_mib']} MiB at half-time, {result['rss_end_mib']} MiB at "
        f"the end; peak {result['peak_rss_mib']} MiB; checks "
        f"{'FAILED' if verdict.failures else 'ok'}"
    )
    # Throughput per chunk (a minute each by default): a plan that degrades as the ledger grows
    # shows up as a slope here, long before any single figure looks wrong.
    rates = [c["rps"] for c in chunks]
    result["rps_per_chunk"] = rates
    _say("  soak throughput per chunk: " + ", ".join(f"{r:,.0f}" for r in rates) + " req/s")
    if len(rates) >= 2 and rates[-1] < SOAK_DECAY * rates[0]:
        verdict.failures.append(
            f"throughput decayed: the last chunk ran at {rates[-1]:,.0f} req/s, more than "
            f"{1 - SOAK_DECAY:.0%} below the first ({rates[0]:,.0f} req/s)"
        )
    for line in verdict.failures:
        _say(f"    FAILURE: {line}")
        bench.failures.append(f"soak: {line}")
    for line in verdict.warnings:
        _say(f"    warning: {line}")
    return result


# The soak fails when its last chunk is this much slower than its first.
SOAK_DECAY = 0.8


def profile_scenario(bench: Bench, scenario: Scenario, store: str, native: bool) -> None:
    """Run one scenario's receiver under py-spy: an SVG flame graph, then raw stacks summarized
    into the top frames (benchmarks/results/profile-<scenario>-<store>.*)."""
    s = bench.settings
    target = _target(bench, store)
    target.prepare()
    scene = Scene(bench, scenario, target)
    stem = RESULTS / f"profile-{scenario.name}-{store}"
    outputs = [(stem.with_suffix(".svg"), "flamegraph", False)]
    outputs.append((Path(f"{stem}.raw.txt"), "raw", False))
    if native:
        outputs.append((Path(f"{stem}.native.raw.txt"), "raw", True))
    with bench.receiver(target, scenario, scene.invocations) as server:
        scene.seed(server)
        scene.run(server, "warmup", s.warmup)
        pid = server.workers_pids()[0]
        for out, fmt, with_native in outputs:
            spy = profile.record(pid, out, seconds=s.profile_seconds, fmt=fmt, native=with_native)
            time.sleep(0.5)  # let py-spy attach before the load starts
            run = scene.run(server, f"profile-{fmt}", s.profile_seconds)
            spy_out, _ = spy.communicate(timeout=60)
            _say(
                f"  {out.name}: {run.wrk.rps:,.0f} req/s under py-spy "
                f"({spy_out.decode(errors='replace').strip().splitlines()[-1:]})"
            )
        if shutil.which("strace"):
            counted = Path(f"{stem}.strace.txt")
            tracer = profile.syscalls(pid, counted)
            time.sleep(0.5)
            run = scene.run(server, "profile-strace", s.profile_seconds)
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
            per_request = profile.per_request(counted, run.wrk.requests)
            Path(f"{stem}.syscalls.txt").write_text(per_request)
            counted.unlink()
            _say(per_request)
    verdict = scene.verdict()
    for line in verdict.failures:
        _say(f"    FAILURE: {line}")
        bench.failures.append(f"profile {store}/{scenario.name}: {line}")
    for out, fmt, _ in outputs:
        if fmt == "raw":
            summary = profile.summarize(out)
            top = Path(str(out).replace(".raw.txt", ".top.txt"))
            top.write_text(summary)
            _say(f"\n{top.relative_to(HERE.parent)}:\n{summary}")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=HERE.parent, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip()


def _meta(bench: Bench, stores: Sequence[str]) -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    described = {}
    for store in stores:
        described[store] = _target(bench, store).describe()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": f"{os.cpu_count()} cores, {cpu}",
        "python": platform.python_version(),
        "packages": {
            p: _version(p)
            for p in (
                "starlette",
                "uvicorn",
                "uvloop",
                "httptools",
                "asyncpg",
                "aiosqlite",
                "orjson",
            )
        },
        "wrk": load.wrk_version(),
        "stores": described,
        "settings": bench.settings.__dict__,
        "uvicorn_workers_default": 1,
        "uvicorn": "--loop uvloop --http httptools --no-access-log --log-level warning",
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark the receiver against a bare Starlette endpoint "
        "(see benchmarks/README.md).",
    )
    parser.add_argument("--quick", action="store_true", help="short rounds: under 2 minutes")
    parser.add_argument("--duration", type=int, help="seconds per measured round")
    parser.add_argument("--rounds", type=int, help="measured rounds per side")
    parser.add_argument("--warmup", type=int, help="seconds of warm-up per server")
    parser.add_argument("--connections", type=int, help="wrk connections (default 64)")
    parser.add_argument("--threads", type=int, help="wrk threads (default 1)")
    parser.add_argument("--body", type=int, help="body size in bytes (default 1024)")
    parser.add_argument("--soak", type=int, help="soak seconds (default 300; 0 skips it)")
    parser.add_argument("--soak-store", choices=("postgresql", "sqlite"))
    parser.add_argument("--verifier", type=float, help="verifier micro-benchmark seconds")
    parser.add_argument("--agents", type=float, help="middleware/executor seconds per side")
    parser.add_argument("--tracing", type=int, help="tracing micro-benchmark rounds (0 skips)")
    parser.add_argument("--queued", type=int, help="queued-mode benchmark rounds (0 skips)")
    parser.add_argument("--peers", type=int, help="rounds against the job queues (0 skips)")
    parser.add_argument("--dbos", type=int, help="rounds against DBOS workflows (0 skips)")
    parser.add_argument(
        "--keyed-http", type=int, help="rounds of the middleware over HTTP (0 skips)"
    )
    parser.add_argument(
        "--stores", default="postgresql,sqlite", help="comma-separated: postgresql,sqlite"
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(s.name for s in SCENARIOS),
        help="comma-separated, of: " + ", ".join(s.name for s in SCENARIOS),
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="SCENARIO:STORE",
        help="instead of the table: profile this scenario with py-spy (repeatable)",
    )
    parser.add_argument("--profile-seconds", type=int, help="seconds per py-spy recording")
    parser.add_argument("--native", action="store_true", help="also a py-spy --native recording")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", DEFAULT_PG),
        help="database to drop and recreate per scenario [env BENCH_PG_URL]",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where latest.json/png go")
    parser.add_argument("--keep", action="store_true", help="keep the work files (ids, logs)")
    parser.add_argument(
        "--receiver-log",
        action="store_true",
        help="let the receiver log its INFO line per delivery (to a file), to see its cost",
    )
    parser.add_argument(
        "--overload",
        action="store_true",
        help="only the overload run (benchmarks/overload.py): 1x-8x capacity, admission "
        "control off and on, and a sender's backlog replay",
    )
    parser.add_argument(
        "--overload-levels", default="1,2,4,8", help="multiples of the capacity to offer"
    )
    parser.add_argument(
        "--overload-seconds", type=float, default=10.0, help="seconds per overload level"
    )
    parser.add_argument(
        "--overload-connections", type=int, default=2048, help="most connections open at once"
    )
    parser.add_argument(
        "--sender-timeout", type=float, default=5.0, help="seconds a sender waits for an answer"
    )
    parser.add_argument(
        "--backlog", type=int, default=100_000, help="deliveries in the backlog replay (0 skips)"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each scenario, wait up to SECONDS for other processes to leave the CPU",
    )
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> Settings:
    settings = QUICK if args.quick else FULL
    overrides = {
        name: getattr(args, name)
        for name in (
            "duration",
            "rounds",
            "warmup",
            "connections",
            "threads",
            "body",
            "soak",
            "soak_store",
            "verifier",
            "agents",
            "tracing",
            "queued",
            "peers",
            "dbos",
            "keyed_http",
            "profile_seconds",
        )
        if getattr(args, name) is not None
    }
    return replace(settings, **overrides)


def _selected(args: argparse.Namespace) -> tuple[list[Scenario], list[str]]:
    known = {s.name: s for s in SCENARIOS}
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    stores = [n.strip() for n in args.stores.split(",") if n.strip()]
    for name in names:
        if name not in known:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(known)}")
    for store in stores:
        if store not in ("postgresql", "sqlite"):
            raise SystemExit(f"unknown store {store!r}: postgresql or sqlite")
    return [known[n] for n in names], stores


def _preflight() -> None:
    missing = []
    if shutil.which("wrk") is None:
        missing.append("wrk (apt-get install wrk)")
    for module, package in (("matplotlib", "matplotlib"), ("standardwebhooks", "standardwebhooks")):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(f"{package} (.venv/bin/pip install -r benchmarks/requirements.txt)")
    if missing:
        raise SystemExit("missing: " + "; ".join(missing))


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    work = RESULTS / "tmp" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    try:
        yield work
    finally:
        if keep:
            _say(f"work files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    scenarios, stores = _selected(args)
    started = time.monotonic()
    with _workdir(args.keep) as work:
        bench = Bench(
            settings, work, args.pg_url, wait_quiet=args.wait_quiet, receiver_log=args.receiver_log
        )
        try:
            if args.profile:
                if not Path(profile.PY_SPY).exists():
                    raise SystemExit("py-spy is missing: .venv/bin/pip install py-spy")
                known = {s.name: s for s in SCENARIOS}
                for spec in args.profile:
                    name, _, store = spec.partition(":")
                    if name not in known or store not in ("postgresql", "sqlite"):
                        raise SystemExit(f"--profile {spec!r}: use SCENARIO:STORE")
                    _say(f"profiling {name} on {store} ({settings.profile_seconds} s each)")
                    profile_scenario(bench, known[name], store, args.native)
                return _finish(bench, started)
            busy = busy_cores()
            if busy > NOISY:
                _say(
                    f"warning: other processes keep {busy:.2f} cores busy: the figures will be "
                    "noisy (--wait-quiet SECONDS waits for a quiet machine before each scenario)"
                )
            result: dict[str, Any] = {"meta": _meta(bench, stores), "scenarios": []}
            result["meta"]["busy_cores_at_start"] = round(busy, 2)
            if result["meta"]["stores"].get("postgresql", {}).get("autovacuum") == "off":
                _say(
                    "warning: PostgreSQL runs with autovacuum=off: the ledger is never analyzed "
                    "or vacuumed during the run (production runs autovacuum), so plans chosen "
                    "on empty tables stay and dead index entries pile up"
                )
            _say(
                f"receiver vs bare Starlette, {settings.connections} connections, "
                f"{settings.body} B bodies, {settings.rounds} x {settings.duration} s rounds "
                f"per side, interleaved"
            )
            for store in stores:
                for scenario in scenarios:
                    result["scenarios"].append(run_scenario(bench, scenario, store))
            bench.close()
            if settings.verifier:
                _say("verifier micro-benchmark...")
                result["verifier"] = verifier.run(settings.verifier, size=settings.body)
                _say(verifier.describe(result["verifier"]))
            if settings.agents:
                _say("Idempotency-Key middleware and action executor...")
                result["agents"] = agents.run(settings.agents, agents.agents_url(args.pg_url))
                _say(agents.describe(result["agents"]))
            if settings.tracing:
                _say("tracing micro-benchmark...")
                result["tracing"] = tracing.run(settings.tracing)
                _say(tracing.describe(result["tracing"]))
            if settings.queued and "postgresql" in stores:
                _say("queued mode: ingest vs bare and inline, worker drain rate...")
                result["queued"] = queued.run(
                    args.pg_url,
                    rounds=settings.queued,
                    duration=settings.duration,
                    connections=settings.connections,
                    work=bench.path("queued"),
                )
                _say(queued.describe(result["queued"]))
                if not result["queued"]["ok"]:
                    bench.failures.append("queued: " + queued.describe(result["queued"]))
            if settings.peers and "postgresql" in stores:
                _say("the queue against pgqueuer and procrastinate...")
                result["peers"] = peers.run(
                    args.pg_url,
                    rounds=settings.peers,
                    drain_seconds=settings.peer_seconds,
                    work_dir=bench.path("peers"),
                )
                _say(peers.describe(result["peers"]))
                if not result["peers"]["ok"]:
                    bench.failures.append("peers: " + peers.describe(result["peers"]))
            if settings.dbos and "postgresql" in stores:
                _say("the action executor against DBOS workflows...")
                result["dbos"] = dbos_peer.run(
                    args.pg_url,
                    rounds=settings.dbos,
                    seconds=settings.dbos_seconds,
                    work_dir=bench.path("dbos"),
                )
                _say(dbos_peer.describe(result["dbos"]))
                if not result["dbos"]["ok"]:
                    bench.failures.append("dbos: " + dbos_peer.describe(result["dbos"]))
            if settings.keyed_http and "postgresql" in stores:
                _say("the Idempotency-Key middleware over HTTP against the hand-written one...")
                result["keyed_http"] = keyed_http.run(
                    args.pg_url, rounds=settings.keyed_http, seconds=max(2, settings.duration)
                )
                _say(keyed_http.describe(result["keyed_http"]))
                if not result["keyed_http"]["ok"]:
                    bench.failures.append(
                        "keyed_http: " + keyed_http.describe(result["keyed_http"])
                    )
            if settings.soak:
                _say(f"soak: {settings.soak} s on {settings.soak_store}...")
                result["soak"] = soak(bench)
            result["failures"] = bench.failures
            result["elapsed_s"] = round(time.monotonic() - started, 1)
            _say("\n" + report.table(result["scenarios"]))
            _say(
                "  (ratio: receiver req/s / bare req/s in the same interleaved rounds; "
                "us/req: CPU time per request of the server process(es) and of PostgreSQL)"
            )
            if "verifier" in result:
                v = result["verifier"]
                _say(
                    f"verifier: {v['ratio']:.2f}x standardwebhooks ({v['ratio_with_parse']:.2f}x "
                    "counting the JSON parse both need)"
                )
            if "soak" in result:
                _say(f"soak peak RSS: {result['soak']['peak_rss_mib']} MiB")
            args.out.mkdir(parents=True, exist_ok=True)
            report.write_json(args.out / "latest.json", result)
            report.chart(args.out / "latest.png", result)
            hand = report.against_hand(result["scenarios"])
            if hand:
                _say("\nagainst the hand-written receivers (same run):\n" + hand)
            statements = report.per_statement(result["scenarios"])
            if statements:
                _say("\nPostgreSQL per answered request, by statement (pg_stat_statements):\n")
                _say(statements)
            (args.out / "latest.md").write_text(
                report.markdown(result["scenarios"]) + "\n\n" + hand + "\n\n" + statements + "\n"
            )
            _say(f"wrote {args.out / 'latest.json'}, latest.png, latest.md")
            return _finish(bench, started)
        finally:
            bench.close()


def _finish(bench: Bench, started: float) -> int:
    _say(f"elapsed {time.monotonic() - started:.0f} s")
    if bench.failures:
        _say("\n" + "!" * 78)
        _say(f"CORRECTNESS FAILURES ({len(bench.failures)}):")
        for line in bench.failures:
            _say(f"  {line}")
        _say("!" * 78)
        return 1
    _say("correctness: no double execution, every 2xx backed by a committed receipt")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.overload:
        # Its own load generator (an open loop: wrk cannot offer a fixed rate), no wrk needed.
        args.levels = overload.levels_of(args.overload_levels)
        args.connections = args.overload_connections
        args.warm_rate = 300.0
        with _workdir(args.keep) as work:
            return overload.run(args, work, args.pg_url, args.out)
    _preflight()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
