"""``python -m benchmarks --overload``: the receiver past its capacity, with admission control
off and on, and a sender's backlog replayed as fast as the connections allow.

Senders do not wait for the receiver to be ready: events arrive at their own rate, and each
sender hangs up after its time limit. So the load here is open-loop: deliveries start at a
fixed rate (1x, 2x, 4x and 8x the capacity measured first), each on a connection of its own
(kept alive and reused when idle, at most ``--overload-connections`` open), and each gives up
after the sender's limit (``--sender-timeout``, 5 s by default, Shopify's). wrk cannot offer a
fixed rate (it sends the next request when the last one is answered), so the generator is this
module: pre-signed Standard Webhooks deliveries written to raw HTTP/1.1 connections by asyncio
with uvloop, in the runner's process.

Per level and side: goodput (deliveries answered 2xx within the sender's limit, per second),
p50/p99 of the answered 2xx, answers shed (503/429), deliveries timed out, handler runs per
delivery, business rows of deliveries whose sender had already hung up (work nobody waited
for), and any delivery whose business row was written twice. The receiver is
``benchmarks/app.py`` with the handler that inserts one row, on PostgreSQL; "off" is
``max_in_progress=0`` (no admission control, no time budget), "on" the defaults.

The backlog: N deliveries (half of them redeliveries of events already completed), offered by
``--overload-connections`` senders as fast as answers come back; a shed or timed-out delivery
is offered again after its ``Retry-After``. Every one must end answered 2xx, each event's row
written once, and the redeliveries answered from the ledger without running a handler.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import random
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from receiver import generate_secret

from . import load, servers
from .business import PROVIDER
from .stores import PostgresTarget

DEFAULT_LEVELS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    request: bytes  # the whole HTTP request


@dataclass
class Answer:
    webhook_id: str
    status: int  # 0: timed out; -1: no connection could be had
    seconds: float
    retry_after: float = 0.0
    replayed: bool = False
    new_connection: bool = False  # sent on a connection opened for it


def requests_for(
    ids: Sequence[str], template: load.Template, signer: load.Signer, port: int
) -> list[Delivery]:
    now = int(time.time())
    out = []
    for webhook_id in ids:
        body = template.body(webhook_id)
        signature = signer.sign(webhook_id, now, body)
        head = (
            f"POST /{PROVIDER} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"webhook-id: {webhook_id}\r\nwebhook-timestamp: {now}\r\n"
            f"webhook-signature: {signature}\r\n\r\n"
        )
        out.append(Delivery(webhook_id, head.encode() + body))
    return out


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one delivery at a time, its answer parsed by hand (status,
    Content-Length, Retry-After, Idempotent-Replayed): the client must stay cheap next to the
    server it measures on the same two cores."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: Any = None  # asyncio's or uvloop's transport
        self.buffer = b""
        self.delivery: Delivery | None = None
        self.started = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.done: Callable[[Answer], None] | None = None
        self.new = True

    def start(
        self, delivery: Delivery, started: float, patience: float, done: Callable[[Answer], None]
    ) -> None:
        self.delivery, self.started, self.done, self.buffer = delivery, started, done, b""
        self.new = self.transport is None
        self.timer = self.pool.loop.call_at(
            self.pool.loop.time() + patience - (time.perf_counter() - started), self.expire
        )
        if self.transport is not None:
            self.transport.write(delivery.request)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.delivery is not None:
            self.transport.write(self.delivery.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.delivery is None:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 : head.find(b"\r\n", at)]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = int(self.buffer[9:12])
        retry = 0.0
        at = head.find(b"retry-after:")
        if at >= 0:
            stop = head.find(b"\r\n", at)
            retry = float(head[at + 12 : stop if stop >= 0 else None])
        replayed = b"idempotent-replayed: true" in head
        self._finish(status, retry, replayed)
        self.pool.idle.append(self)

    def expire(self) -> None:
        """The sender's limit: it hangs up, and the connection goes with its request."""
        self.timer = None
        self._finish(0, 0.0, False)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.open -= 1
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        if self.delivery is not None:
            self._finish(0, 0.0, False)

    def _finish(self, status: int, retry: float, replayed: bool) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        delivery, done = self.delivery, self.done
        self.delivery = self.done = None
        if delivery is not None and done is not None:
            took = time.perf_counter() - self.started
            done(Answer(delivery.webhook_id, status, took, retry, replayed, self.new))


class Pool:
    """Keep-alive connections to one server: idle ones are reused, at most ``limit`` open."""

    def __init__(self, port: int, limit: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.port = port
        self.limit = limit
        self.open = 0
        self.idle: list[_Connection] = []

    def send(self, delivery: Delivery, patience: float, done: Callable[[Answer], None]) -> None:
        started = time.perf_counter()
        if self.idle:
            self.idle.pop().start(delivery, started, patience, done)
            return
        if self.open >= self.limit:
            done(Answer(delivery.webhook_id, -1, 0.0))
            return
        self.open += 1
        connection = _Connection(self)
        connection.start(delivery, started, patience, done)
        self.loop.create_task(self._connect(connection))

    async def _connect(self, connection: _Connection) -> None:
        try:
            await self.loop.create_connection(lambda: connection, "127.0.0.1", self.port)
        except OSError:
            connection.connection_lost(None)

    def close(self) -> None:
        for connection in self.idle:
            if connection.transport is not None:
                connection.transport.close()
        self.idle.clear()


async def offer(
    deliveries: Sequence[Delivery], rate: float, port: int, patience: float, limit: int
) -> list[Answer]:
    """Start deliveries at ``rate`` per second whatever the answers (an open loop)."""
    pool = Pool(port, limit)
    answers: list[Answer] = []
    # Deliveries that found every connection busy: counted by index, and answered only after
    # the run, so that the generator spends next to nothing on them while the server works.
    unsent: list[int] = []
    finished = pool.loop.create_future()

    def done(answer: Answer) -> None:
        answers.append(answer)
        if len(answers) + len(unsent) == len(deliveries) and not finished.done():
            finished.set_result(None)

    start = time.perf_counter()
    sent = 0
    while sent < len(deliveries):
        due = min(len(deliveries), int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            if pool.idle or pool.open < pool.limit:
                pool.send(deliveries[sent], patience, done)
            else:
                unsent.append(sent)
            sent += 1
        await asyncio.sleep(0.001)
    if len(answers) + len(unsent) < len(deliveries):
        await finished
    pool.close()
    answers.extend(Answer(deliveries[i].webhook_id, -1, 0.0) for i in unsent)
    return answers


async def closed_loop(
    deliveries: Sequence[Delivery], concurrency: int, port: int, patience: float
) -> tuple[list[Answer], float]:
    """``concurrency`` senders, each sending its next delivery once the last is answered; a
    shed or timed-out delivery is offered again after its Retry-After (at least 0.1 s).
    Returns every answer and the seconds until each delivery was answered 2xx."""
    pool = Pool(port, concurrency)
    queue: collections.deque[Delivery] = collections.deque(deliveries)
    answers: list[Answer] = []
    left = len(deliveries)
    finished = pool.loop.create_future()
    by_id = {d.webhook_id: d for d in deliveries}

    def next_one() -> None:
        if queue:
            pool.send(queue.popleft(), patience, done)

    def again(delivery: Delivery) -> None:
        queue.append(delivery)
        next_one()

    def done(answer: Answer) -> None:
        nonlocal left
        answers.append(answer)
        if 200 <= answer.status < 300:
            left -= 1
            if left == 0 and not finished.done():
                finished.set_result(None)
            pool.loop.call_soon(next_one)
        else:
            delay = max(answer.retry_after, 0.1) * random.uniform(1.0, 1.5)
            pool.loop.call_later(delay, again, by_id[answer.webhook_id])

    start = time.perf_counter()
    for _ in range(min(concurrency, len(deliveries))):
        next_one()
    if deliveries:
        await finished
    pool.close()
    return answers, time.perf_counter() - start


def run_async(coro: Any) -> Any:
    """Run one of the generator's loops, without the cyclic garbage collector: a collection
    of the hundreds of thousands of deliveries built beforehand stops the generator for tens
    of milliseconds, in which no delivery starts and every answer waits to be read (the
    senders it stands for are many machines, none of which pauses the others). It collects
    once the loop has ended."""
    run: Callable[[Any], Any] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    gc.collect()
    gc.disable()
    try:
        return run(coro)
    finally:
        gc.enable()


@dataclass
class Level:
    side: str
    multiple: float
    offered_per_s: float
    seconds: float
    deliveries: int
    goodput_per_s: float = 0.0
    goodput_of_capacity: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    answered_2xx: int = 0
    late_2xx: int = 0
    shed: int = 0
    timed_out: int = 0
    no_connection: int = 0
    other: dict[str, int] = field(default_factory=dict)
    handler_runs: int = 0
    runs_per_delivery: float = 0.0
    rows_for_gone_senders: int = 0
    written_twice: int = 0
    server_cpu_s: float = 0.0
    #: Where the slow answers' time went: 2xx answers that took over 1 s at the sender, and
    #: deliveries executed in over 1 s from their arrival in the process (its own duration
    #: histogram), the difference being time before the process read them; and the share of
    #: the slowest 1% of 2xx answers sent on a connection opened for them.
    over_1s: int = 0
    over_1s_in_process: int | None = None
    slowest_on_new_connections: float | None = None


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _invocations(directory: Path) -> collections.Counter[str]:
    found: collections.Counter[str] = collections.Counter()
    for path in directory.glob("*.log"):
        for line in path.read_text().splitlines():
            if line:
                found[line.split()[0]] += 1
    return found


def _executed_over_1s(port: int) -> tuple[float, float]:
    """From the receiver's own histogram of durations from arrival to answer: how many
    deliveries it has executed, and how many of them took over a second."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    executed = within = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "receiver_delivery_duration_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("outcome") != "executed":
                continue
            if sample.name.endswith("_count"):
                executed += sample.value
            elif sample.name.endswith("_bucket") and sample.labels.get("le") == "1.0":
                within += sample.value
    return executed, executed - within


class Overload:
    def __init__(self, args: Any, work: Path, pg_url: str) -> None:
        self.args = args
        self.work = work
        self.target = PostgresTarget(pg_url)
        self.secret = generate_secret()
        self.signer = load.Signer(self.secret)
        self.run_id = f"{random.randrange(16**6):06x}"
        self.ids = load.Ids(self.run_id)
        self.template = load.Template.make(1024, self.ids.length)
        self._n = 0

    def path(self, name: str) -> Path:
        self._n += 1
        return self.work / f"{self._n:03d}-{name}"

    def server(self, side: str, invocations: Path) -> servers.Server:
        # Each server starts on a vacuumed, analyzed ledger, as autovacuum keeps one: with
        # autovacuum off (as on the CI machine), each level would otherwise run on the dead
        # tuples and index entries of every level before it, and the last, 8x, on the most.
        self.target.vacuum()
        invocations.mkdir(parents=True, exist_ok=True)
        env = {
            "BENCH_STORE": self.target.url,
            "BENCH_SECRET": self.secret,
            "BENCH_HANDLER": "insert",
            "BENCH_INVOCATIONS": str(invocations),
            "BENCH_TIMEOUT": str(self.args.sender_timeout),
        }
        if self.args.keep:
            env["BENCH_ADMISSION_LOG"] = "1"  # the admission's state every 0.5 s, in the log
        if side == "off":
            env["BENCH_ADMISSION"] = "0"
        log = self.path(f"{side}.log")
        return servers.Server(f"overload-{side}", "benchmarks.app", workers=1, env=env, log=log)

    def level(self, side: str, multiple: float, capacity: float) -> Level:
        seconds = self.args.overload_seconds
        rate = capacity * multiple
        ids = self.ids.take(int(rate * seconds))
        invocations = self.path(f"invocations-{side}-{multiple:g}x")
        with self.server(side, invocations) as server:
            # Two seconds at its capacity first, as a process that has served traffic before
            # the flood: it has measured what it can do (a process that has not admits
            # everything until it has, see docs/how-to/load-shedding.md).
            self._warm(server, int(capacity * 2), 64)
            deliveries = requests_for(ids, self.template, self.signer, server.port)
            cpu = server.cpu_seconds()
            executed, slow = _executed_over_1s(server.port)
            limit, connections = self.args.sender_timeout, self.args.connections
            answers = run_async(offer(deliveries, rate, server.port, limit, connections))
            time.sleep(1.0)  # let the work of abandoned deliveries end before counting it
            cpu = server.cpu_seconds() - cpu
            executed_after, slow_after = _executed_over_1s(server.port)
        result = Level(side, multiple, rate, seconds, len(ids), server_cpu_s=round(cpu, 1))
        if executed_after > executed:
            result.over_1s_in_process = round(slow_after - slow)
        self._score(result, answers, invocations, capacity)
        return result

    def _score(
        self, result: Level, answers: Sequence[Answer], invocations: Path, capacity: float
    ) -> None:
        limit = self.args.sender_timeout
        good = [a for a in answers if 200 <= a.status < 300 and a.seconds <= limit]
        result.answered_2xx = len(good)
        result.late_2xx = sum(1 for a in answers if 200 <= a.status < 300 and a.seconds > limit)
        result.shed = sum(1 for a in answers if a.status in (429, 503))
        result.timed_out = sum(1 for a in answers if a.status == 0)
        result.no_connection = sum(1 for a in answers if a.status == -1)
        other = collections.Counter(
            str(a.status) for a in answers if a.status >= 300 and a.status not in (429, 503)
        )
        result.other = dict(other)
        result.goodput_per_s = round(len(good) / result.seconds, 1)
        result.goodput_of_capacity = round(result.goodput_per_s / capacity, 3)
        latencies = [a.seconds * 1000 for a in good]
        p50, p99 = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
        result.over_1s = sum(1 for a in good if a.seconds > 1.0)
        slowest = sorted(good, key=lambda a: a.seconds)[-max(1, len(good) // 100) :]
        if good:
            share = sum(a.new_connection for a in slowest) / len(slowest)
            result.slowest_on_new_connections = round(share, 3)
        result.p50_ms = None if p50 is None else round(p50, 1)
        result.p99_ms = None if p99 is None else round(p99, 1)
        runs = _invocations(invocations)
        result.handler_runs = sum(runs.values())
        result.runs_per_delivery = round(result.handler_runs / max(1, len(runs)), 3)
        rows = self.target.snapshot().business
        answered = {a.webhook_id for a in good}
        mine = {a.webhook_id for a in answers}
        result.rows_for_gone_senders = sum(1 for i in mine if rows.get(i) and i not in answered)
        result.written_twice = sum(1 for i in mine if rows.get(i, 0) > 1)

    def _warm(self, server: servers.Server, count: int, senders: int) -> float:
        """``count`` deliveries by ``senders`` in a closed loop; returns the rate at which the
        server answered them (deliveries/s)."""
        ids = self.ids.take(count)
        deliveries = requests_for(ids, self.template, self.signer, server.port)
        _, seconds = run_async(closed_loop(deliveries, senders, server.port, 30.0))
        return len(ids) / seconds

    def capacity(self) -> float:
        """Deliveries per second one process completes with 64 senders in a closed loop, over
        about as long as a level lasts (the warm-up's rate says how many that takes). Without
        the bound: 64 senders cannot over-admit, and a bound still learning the process's
        capacity would hold the measurement of it down."""
        invocations = self.path("invocations-capacity")
        with self.server("off", invocations) as server:
            rate = max(self._warm(server, int(self.args.warm_rate * 2), 32), self.args.warm_rate)
            ids = self.ids.take(int(rate * self.args.overload_seconds))
            deliveries = requests_for(ids, self.template, self.signer, server.port)
            answers, seconds = run_async(closed_loop(deliveries, 64, server.port, 30.0))
        done = sum(1 for a in answers if 200 <= a.status < 300)
        return float(done / seconds)

    def backlog(self, total: int) -> dict[str, Any]:
        """``total`` deliveries, half of them redeliveries of completed events."""
        half = total // 2
        seen = self.ids.take(half)
        fresh = self.ids.take(total - half)
        invocations = self.path("invocations-backlog")
        with self.server("on", invocations) as server:
            first = requests_for(seen, self.template, self.signer, server.port)
            seeded, seed_s = run_async(closed_loop(first, 64, server.port, 30.0))
            before = _invocations(invocations)
            backlog = requests_for(seen + fresh, self.template, self.signer, server.port)
            random.shuffle(backlog)
            answers, seconds = run_async(
                closed_loop(backlog, self.args.connections, server.port, self.args.sender_timeout)
            )
            time.sleep(1.0)
        after = _invocations(invocations)
        snapshot = self.target.snapshot()
        final = {a.webhook_id: a for a in answers if 200 <= a.status < 300}
        ids = set(seen) | set(fresh)
        return {
            "deliveries": total,
            "redeliveries": half,
            "seed_seconds": round(seed_s, 1),
            "seconds": round(seconds, 1),
            "per_second": round(total / seconds, 1),
            "attempts": len(answers),
            "shed_answers": sum(1 for a in answers if a.status in (429, 503)),
            "timed_out": sum(1 for a in answers if a.status == 0),
            "ended_2xx": len(final),
            "lost": len(ids - set(final)),
            "completed_receipts": len(snapshot.with_state("completed") & ids),
            "rows_once": sum(1 for i in ids if snapshot.business.get(i) == 1),
            "rows_twice": sum(1 for i in ids if snapshot.business.get(i, 0) > 1),
            "handler_runs_for_redeliveries": sum(after[i] - before[i] for i in seen),
            "redeliveries_answered_replayed": sum(
                1 for i in seen if i in final and final[i].replayed
            ),
            "seed_answers_2xx": sum(1 for a in seeded if 200 <= a.status < 300),
        }


def _markdown(levels: Sequence[Level], capacity: float) -> str:
    lines = [
        f"capacity (1x): {capacity:.0f} deliveries/s",
        "",
        "| side | load | offered/s | goodput/s | of 1x | p50 | p99 | shed | timed out | "
        "no connection | runs/delivery | rows for gone senders | written twice | "
        "2xx over 1 s: at the sender / in the process | slowest 1% on new connections |",
        "|" + " --- |" * 15,
    ]
    for r in levels:
        new = "-" if r.slowest_on_new_connections is None else f"{r.slowest_on_new_connections:.0%}"
        lines.append(
            f"| {r.side} | {r.multiple:g}x | {r.offered_per_s:.0f} | {r.goodput_per_s:.0f} | "
            f"{r.goodput_of_capacity:.0%} | {r.p50_ms} ms | {r.p99_ms} ms | {r.shed} | "
            f"{r.timed_out} | {r.no_connection} | {r.runs_per_delivery} | "
            f"{r.rows_for_gone_senders} | {r.written_twice} | "
            f"{r.over_1s} / {'-' if r.over_1s_in_process is None else r.over_1s_in_process} | "
            f"{new} |"
        )
    return "\n".join(lines)


def run(args: Any, work: Path, pg_url: str, out: Path) -> int:
    bench = Overload(args, work, pg_url)
    print(f"overload: preparing {pg_url}", flush=True)
    bench.target.prepare()
    capacity = bench.capacity()
    print(f"overload: capacity {capacity:.0f} deliveries/s (64 senders, closed loop)", flush=True)
    levels: list[Level] = []
    for multiple in args.levels:
        for side in ("off", "on"):  # interleaved: both sides under the same noise
            result = bench.level(side, multiple, capacity)
            levels.append(result)
            print(json.dumps(asdict(result)), flush=True)
    backlog = bench.backlog(args.backlog) if args.backlog else None
    if backlog:
        print("backlog: " + json.dumps(backlog), flush=True)
    table = _markdown(levels, capacity)
    print(table, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overload.json").write_text(
        json.dumps(
            {
                "capacity_per_s": capacity,
                "sender_timeout_s": args.sender_timeout,
                "connections": args.connections,
                "levels": [asdict(r) for r in levels],
                "backlog": backlog,
            },
            indent=2,
        )
    )
    (out / "overload.md").write_text(table + "\n")
    failures = [
        f"{r.side} {r.multiple:g}x: {r.written_twice} deliveries written twice"
        for r in levels
        if r.written_twice
    ]
    if backlog and (backlog["lost"] or backlog["rows_twice"]):
        failures.append(f"backlog: {backlog['lost']} lost, {backlog['rows_twice']} twice")
    for line in failures:
        print("CORRECTNESS FAILURE: " + line, flush=True)
    return 1 if failures else 0


def levels_of(text: str) -> list[float]:
    """``"1,2,4,8"`` -> ``[1.0, 2.0, 4.0, 8.0]``."""
    return [float(x) for x in text.split(",") if x.strip()]
