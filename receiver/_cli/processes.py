"""The commands that run until stopped, or sweep once: ``receiver serve`` (uvicorn),
``receiver worker`` (queued mode) and ``receiver sweep``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging.config
import os
import signal
import tempfile
from collections.abc import Iterator

from .._exceptions import ReceiverError
from .._logging import get_logger, logging_config
from .._ops.sweeper import AUDIT_RETENTION, DEAD_LETTER_RETENTION, KeySweeper, SweepReport
from .._store.base import Store
from .._verification.verifier import generate_secret
from .._webhooks.app import DEFAULT_STORE, Receiver
from .._webhooks.schedules import parse_duration
from .loading import (
    DEFAULT_APP,
    build_receiver,
    check_store_applies,
    config_receiver,
    existing_store,
    load_app,
    load_receiver,
    read,
)
from .output import emit

logger = get_logger("receiver.worker")


def serve(args: argparse.Namespace) -> int:
    if args.config:
        config_receiver(args)  # report configuration errors before uvicorn starts
        # Each worker process builds its own Receiver from the file (receiver/_config/loader.py).
        os.environ["RECEIVER_CONFIG"] = os.path.abspath(args.config)
        if args.store:
            os.environ["RECEIVER_STORE"] = args.store
        app, factory = "receiver._config.loader:_app_from_environment", True
    else:
        check_store_applies(args)
        os.environ["RECEIVER_STORE"] = args.store or DEFAULT_STORE
        demo = args.app == DEFAULT_APP and not os.environ.get("RECEIVER_SECRET")
        if demo:
            # The demo reads its secret when it is imported.
            os.environ["RECEIVER_SECRET"] = generate_secret()
        # Import once here so configuration errors are reported before uvicorn starts, and
        # before the demo's "Try it" line, which is for an app that starts.
        load_app(args.app)
        if demo:
            secret, url = os.environ["RECEIVER_SECRET"], f"http://{args.host}:{args.port}/demo"
            print(
                "No RECEIVER_SECRET set: generated a demo secret for provider 'demo'.\n"
                f"  export RECEIVER_SECRET={secret}\n"
                "Try it (run the same line twice to see the replay):\n"
                f"  receiver send --url {url} --secret {secret} --id msg_demo_1\n",
                flush=True,
            )
        app, factory = args.app, False
    with _worker_metrics(args.workers):
        _run_uvicorn(args, app, factory)
    return 0


@contextlib.contextmanager
def _worker_metrics(workers: int) -> Iterator[None]:
    """With several workers, each is a process with its own metrics, and a scrape of /metrics
    reaches one of them. prometheus-client's multiprocess mode sums them: each worker writes
    its counters to files in PROMETHEUS_MULTIPROC_DIR (read when the worker imports
    prometheus-client, so set here, before uvicorn starts them), and the scrape reads them all.
    A directory the operator set is used as it is; otherwise a fresh one, removed at exit (a
    stale one would add the counters of a previous run)."""
    if workers <= 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="receiver-metrics-") as directory:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        try:
            yield
        finally:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def _run_uvicorn(args: argparse.Namespace, app: str, factory: bool) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        log_config=logging_config(args.log_format, args.log_level),
        lifespan="on",
        factory=factory,
        # The receiver decides which forwarding headers to believe (trusted_proxies); uvicorn's
        # own rewriting would trust any local peer's X-Forwarded-For.
        proxy_headers=False,
        # Longer than Kong's (and nginx's) 60 s upstream keepalive, so the gateway closes idle
        # connections first and never sends a request on a socket we are closing.
        timeout_keep_alive=75,
        # One structured line per delivery comes from the receiver itself.
        access_log=False,
    )


async def _sweep_store(store: Store, batch: int, retention: float, audit: float) -> SweepReport:
    """One pass of the sweeper an app without a Receiver has (receiver/_ops/sweeper.py)."""
    async with store:
        sweeper = KeySweeper(store, {}, None, retention=retention, audit_retention=audit)
        return await sweeper.run_once(batch=batch)


def _retentions(args: argparse.Namespace) -> tuple[float, float]:
    """``--dead-letter-retention`` and ``--audit-retention``, for a sweep of ``--store`` alone
    (an app's or a file's Receiver has its own, which these would contradict)."""
    found = []
    for option, value, default in (
        ("--dead-letter-retention", args.dead_letter_retention, DEAD_LETTER_RETENTION),
        ("--audit-retention", args.audit_retention, AUDIT_RETENTION),
    ):
        if value is None:
            found.append(default)
            continue
        if not args.store or args.config:
            raise ReceiverError(
                f"{option} applies to a sweep of --store alone: an app's Receiver (or a "
                "--config file) has its own (dead_letter_retention=, audit_retention=)"
            )
        try:
            found.append(parse_duration(value))
        except ReceiverError as exc:
            raise ReceiverError(f"{option}: {exc}") from None
    return found[0], found[1]


def sweep_command(args: argparse.Namespace) -> int:
    retention, audit = _retentions(args)
    if args.store and not args.config:
        if args.app != DEFAULT_APP:
            raise ReceiverError(
                "--store sweeps a store without an app, --app sweeps with the app's handlers: "
                "give one of them (the app's own store is the one it is built with)"
            )
        # A SQLite path with a typo is reported, not created empty and swept.
        store = existing_store(args.store)
        report = read(store, lambda: _sweep_store(store, args.batch, retention, audit), "sweep")
    else:
        rx = config_receiver(args) if args.config else load_receiver(args.app)

        async def run() -> SweepReport:
            async with rx:
                return await rx.sweep(batch=args.batch)

        report = read(rx.store, run, "sweep")
    if args.json:
        emit(
            {
                "recovered": report.recovered,
                "failed": report.failed,
                "released": report.released,
                "skipped": report.skipped,
                "deleted": report.deleted,
                "audit_deleted": report.audit_deleted,
            }
        )
        return 0
    print(
        f"recovered {report.recovered}, failed {report.failed}, released {report.released}, "
        f"skipped {report.skipped}, deleted {report.deleted} expired and "
        f"{report.audit_deleted} old audit records"
    )
    return 0


def worker_command(args: argparse.Namespace) -> int:
    """Run a worker until SIGTERM or SIGINT, then stop gracefully (receiver/_webhooks/worker.py).
    Every line it writes goes through the logging configuration of ``--log-format``."""
    logging.config.dictConfig(logging_config(args.log_format, args.log_level))
    if args.config:
        rx = config_receiver(args)
    elif args.factory:
        rx = build_receiver(args.app, args.store)
    else:
        check_store_applies(args)
        if args.store:
            os.environ["RECEIVER_STORE"] = args.store
        rx = load_receiver(args.app)
    if rx.store.dialect == "sqlite":
        logger.warning("worker on SQLite: run a single worker process (SQLite has one writer)")

    async def run() -> None:
        worker = rx.worker(
            concurrency=args.concurrency,
            group=args.group,
            poll_interval=args.poll_interval,
            stale_interval=args.stale_interval,
            grace=args.grace,
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.stop)
        if args.metrics_port and rx.metrics is not None:
            _serve_metrics(rx, args.metrics_port)
        if not await worker.open():
            return
        try:
            # (The store's URL without its password: Store.url.)
            logger.info("worker started", extra={"store": rx.store.url})
            await worker.run()
        finally:
            await rx.close()
        worker.summary()

    asyncio.run(run())
    return 0


def _serve_metrics(rx: Receiver, port: int) -> None:
    """The worker's own counters (attempts, dead letters, lag) on ``/metrics``."""
    from prometheus_client import start_http_server

    assert rx.metrics is not None
    start_http_server(port, registry=rx.metrics.registry)
