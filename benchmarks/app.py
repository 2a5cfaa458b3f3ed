"""The receiver as the benchmark serves it: ``uvicorn benchmarks.app:app``, configured by the
runner through the environment:

    BENCH_STORE        store URL (postgresql://... or sqlite:///...)
    BENCH_SECRET       the provider's whsec_ secret
    BENCH_HANDLER      "noop" (default) or "insert" (one business row through tx)
    BENCH_INVOCATIONS  directory where each process appends one line per handler invocation
    BENCH_MODE         "inline" (default) or "queued" (answer 202, handlers on `receiver worker`)
    BENCH_ADMISSION    optional: the Receiver's max_in_progress ("0": no admission control;
                       unset: the default, derived from the pool and the measured latency)
    BENCH_TIMEOUT      optional: the provider's sender time limit in seconds (unset: the
                       preset's; "none": no limit)
    BENCH_ADMISSION_LOG  optional: print the admission's state (in progress, bound, capacity,
                       latencies, shed) to stderr every 0.5 s
    BENCH_LOG          optional file for the receiver's log at INFO (one JSON line per delivery);
                       without it the receiver's INFO lines are disabled, as under uvicorn's
                       --log-level warning with no logging configuration of the application

The Receiver is served alone, as ``uvicorn module:rx`` would, with the library's defaults
(timestamp tolerance 5 minutes, pool of 10, sweeper every 60 s).

The handler answers ``{"id": <webhook-id>}``: the stored answer then names its delivery, so the
runner can match every 2xx that wrk saw (first answers and replays alike) to a receipt. Each
invocation is counted with one ``write(2)`` to a per-process file opened once, outside the
transaction: a true count of executions, committed or not, that costs about a microsecond and
does not grow the server's memory over a soak.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from receiver import Connection, Event, Provider, Receiver

from .business import EVENT_TYPE, INSERT, PROVIDER


class Invocations:
    """Appends ``<webhook-id> <fence>`` per handler invocation to ``<directory>/<pid>.log``."""

    def __init__(self, directory: str | None) -> None:
        self._directory = directory
        self._fd: int | None = None
        self._pid = 0

    def __call__(self, event: Event) -> None:
        if self._directory is None:
            return
        pid = os.getpid()
        if self._fd is None or pid != self._pid:  # opened lazily, once per worker process
            path = os.path.join(self._directory, f"{pid}.log")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._pid = pid
        os.write(self._fd, f"{event.id} {event.fence}\n".encode())


def build(
    store: str,
    secret: str,
    handler: str,
    invocations: str | None,
    mode: str = "inline",
    admission: str | None = None,
    timeout: str | None = None,
) -> Receiver:
    if handler not in ("noop", "insert"):
        raise ValueError(f"BENCH_HANDLER must be noop or insert, not {handler!r}")
    if mode not in ("inline", "queued"):
        raise ValueError(f"BENCH_MODE must be inline or queued, not {mode!r}")
    count = Invocations(invocations)
    options: dict[str, Any] = {}
    if timeout is not None:
        options["timeout"] = None if timeout == "none" else float(timeout)
    provider = Provider(PROVIDER, [secret], mode=mode, **options)  # type: ignore[arg-type]
    limit = None if admission is None else int(admission)
    rx = Receiver(store, [provider], max_in_progress=limit)

    async def noop(event: Event, tx: Connection) -> Any:
        count(event)
        return {"id": event.id}

    async def insert(event: Event, tx: Connection) -> Any:
        count(event)
        await tx.execute(INSERT, event.id, event.fence, event.payload["data"]["amount_cents"])
        return {"id": event.id}

    rx.add_handler(EVENT_TYPE, noop if handler == "noop" else insert)
    return rx


if os.environ.get("BENCH_LOG"):
    # The library's structured formatter where it has one: the realistic cost of a log line.
    import receiver

    _handler = logging.FileHandler(os.environ["BENCH_LOG"])
    _formatter = getattr(receiver, "JSONFormatter", logging.Formatter)
    _handler.setFormatter(_formatter())
    logging.getLogger("receiver").addHandler(_handler)
    logging.getLogger("receiver").setLevel(logging.INFO)

app = build(
    os.environ["BENCH_STORE"],
    os.environ["BENCH_SECRET"],
    os.environ.get("BENCH_HANDLER", "noop"),
    os.environ.get("BENCH_INVOCATIONS"),
    os.environ.get("BENCH_MODE", "inline"),
    os.environ.get("BENCH_ADMISSION"),
    os.environ.get("BENCH_TIMEOUT"),
)

if os.environ.get("BENCH_ADMISSION_LOG"):
    import asyncio
    import gc
    import sys
    import time

    # The garbage collector's pauses, as they stop every delivery in progress: per 0.5 s, the
    # milliseconds spent in collections and the number of full (generation 2) ones.
    _gc = {"started": 0.0, "ms": 0.0, "full": 0}

    def _gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc["started"] = time.perf_counter()
            return
        _gc["ms"] += (time.perf_counter() - _gc["started"]) * 1000
        _gc["full"] += info["generation"] == 2

    gc.callbacks.append(_gc_timer)

    @app.on_startup
    async def _admission_log(conn: Any) -> None:
        async def loop() -> None:
            a = app.admission
            while True:
                await asyncio.sleep(0.5)
                print(
                    f"admission: n={a.in_progress} waiting={a.waiting} bound={a.bound} "
                    f"capacity={a.capacity} alone={a.alone} latency={a.latency} "
                    f"shed={a.shed_total} gc_ms={_gc['ms']:.1f} gc_full={_gc['full']}",
                    file=sys.stderr,
                    flush=True,
                )
                _gc["ms"], _gc["full"] = 0.0, 0

        asyncio.get_running_loop().create_task(loop())
