"""The ``receiver`` command: serve, migrate, send.

Every option can also be given as an environment variable ``RECEIVER_<OPTION>`` (for example
``RECEIVER_STORE``); the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib
import inspect
import logging.config
import os
import signal
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import asyncpg
import httpx
import orjson

from . import _keyed as keyed
from . import _ledger as ledger
from ._app import DEFAULT_STORE, Receiver
from ._config import load_config
from ._exceptions import ConfigurationError, ReceiverError, StoreMisconfigured
from ._ledger import Key, Receipt
from ._logging import FORMATS, logging_config
from ._pipeline import Outcome, Reply
from ._replay import ReplayRefused, failed_keys, replay_all
from ._schedules import PRESETS, dedup_window, describe
from ._sqlite import SQLiteStore
from ._store import Row, Store
from ._store_url import store_from_url
from ._sweeper import KeySweeper, SweepReport
from ._verification import generate_secret, sign

DEFAULT_APP = "handlers:app"
CONFIG_HELP = "a TOML file: store, limits, providers and handler modules (instead of --app)"
STORE_HELP = (
    "store URL: sqlite:///path.db or postgresql://... "
    f"(default: the --config file's store, else {DEFAULT_STORE})"
)


def _add(
    parser: argparse.ArgumentParser, name: str, help: str, default: Any = None, **kw: Any
) -> None:
    env = f"RECEIVER_{name.upper().replace('-', '_')}"
    value = os.environ.get(env, default)
    parser.add_argument(
        f"--{name}", default=value, help=f"{help} [env {env}; default {default}]", **kw
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="receiver", description="Receive webhooks so that each event takes effect once."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the receiver on uvicorn")
    _add(serve, "app", "the ASGI app to serve, module:attribute", DEFAULT_APP)
    _add(serve, "config", CONFIG_HELP)
    _add(serve, "store", STORE_HELP)
    _add(serve, "host", "interface to bind", "127.0.0.1")
    _add(serve, "port", "port to bind", 8000, type=int)
    _add(serve, "workers", "uvicorn worker processes", 1, type=int)
    _add(serve, "log-level", "uvicorn log level", "info")
    _add(serve, "log-format", "json (one object per line) or text", "json", choices=FORMATS)

    migrate = sub.add_parser(
        "migrate", help="apply the schema migrations the store lacks (idempotent)"
    )
    _add(migrate, "config", "take the store from this config file")
    _add(migrate, "store", STORE_HELP)
    migrate.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 listing the missing migrations if the store is behind",
    )

    sweep = sub.add_parser("sweep", help="one sweeper pass: recover stale claims, delete expired")
    _add(
        sweep,
        "app",
        "the Receiver whose handlers recover stale claims, module:attribute",
        DEFAULT_APP,
    )
    _add(sweep, "config", CONFIG_HELP)
    sweep.add_argument(
        "--store",
        default=None,
        help="sweep this store with no app: release Idempotency-Key requests that died, delete "
        "expired receipts and keys (stale webhook and action claims need their handlers and "
        "tools: --app or --config); with --config, the store instead of the file's",
    )
    _add(sweep, "batch", "receipts per batch", 100, type=int)

    worker = sub.add_parser(
        "worker",
        help="run queued deliveries (mode='queued'); any number on one PostgreSQL, one on SQLite",
    )
    _add(worker, "app", "the Receiver whose queued handlers to run, module:attribute", DEFAULT_APP)
    _add(worker, "config", CONFIG_HELP)
    _add(worker, "store", STORE_HELP)
    _add(worker, "concurrency", "attempts run at once by this process", 16, type=int)
    _add(worker, "poll-interval", "seconds between polls when no NOTIFY arrives", 1.0, type=float)
    _add(
        worker,
        "stale-interval",
        "seconds between looks for deliveries a dead worker left in flight (each is taken over "
        "once its lease ran out: at most lease + this after the death)",
        5.0,
        type=float,
    )
    worker.add_argument(
        "--factory",
        action="store_true",
        default=os.environ.get("RECEIVER_FACTORY", "") not in ("", "0", "false"),
        help="--app names a function that builds the Receiver, called as app(store=URL) when "
        "--store is given, else app() [env RECEIVER_FACTORY]",
    )
    _add(worker, "grace", "on SIGTERM, seconds to let running attempts finish", 30.0, type=float)
    _add(worker, "metrics-port", "serve Prometheus metrics on this port (0: none)", 0, type=int)
    _add(worker, "log-level", "log level", "info")
    _add(worker, "log-format", "json (one object per line) or text", "json", choices=FORMATS)

    inspect = sub.add_parser("inspect", help="show one receipt: state, attempts, stored answer")
    inspect.add_argument("provider")
    inspect.add_argument("webhook_id")
    _add(inspect, "store", "store URL", DEFAULT_STORE)
    inspect.add_argument(
        "--principal",
        default=None,
        help="for an Idempotency-Key (PROVIDER idem:NAMESPACE, WEBHOOK_ID the key): whose key",
    )

    failed = sub.add_parser("failed", help="list receipts whose handlers failed")
    _add(failed, "store", "store URL", DEFAULT_STORE)
    _add(failed, "provider", "only this provider", "")
    _add(failed, "limit", "at most this many", 50, type=int)

    replay = sub.add_parser(
        "replay",
        help="run failed deliveries again through the claim/fence path (never completed ones)",
    )
    replay.add_argument(
        "target", nargs="*", metavar="PROVIDER WEBHOOK_ID", help="the delivery to replay"
    )
    replay.add_argument(
        "--all-failed",
        action="store_true",
        help="replay what `receiver failed` lists, oldest first, at most --limit",
    )
    _add(replay, "app", "the Receiver whose handlers run the replay, module:attribute", DEFAULT_APP)
    _add(replay, "config", CONFIG_HELP)
    _add(replay, "provider", "with --all-failed: only this provider", "")
    _add(replay, "limit", "with --all-failed: at most this many", 100, type=int)

    ttl = sub.add_parser(
        "ttl",
        help="explain each provider's retry schedule and dedup window (without --app or "
        "--config: every preset)",
    )
    _add(ttl, "app", "the Receiver whose providers to explain, module:attribute")
    _add(ttl, "config", "explain the providers of this config file (needs no secrets)")

    send = sub.add_parser("send", help="sign a delivery and POST it, to try the receiver")
    _add(send, "url", "the provider's endpoint", "http://127.0.0.1:8000/demo")
    _add(send, "secret", "the provider's whsec_ (or whsk_) secret", None)
    _add(send, "id", "webhook-id (reuse one to see a replay)", None)
    _add(send, "type", "event type", "order.created")
    _add(
        send,
        "data",
        "the event's data, as JSON (default: an order named after the webhook-id, so that each "
        "new id is a new payload)",
    )
    _add(send, "timestamp", "webhook-timestamp (unix seconds; default now)", None, type=int)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        command = {
            "serve": serve,
            "migrate": migrate,
            "send": send,
            "sweep": sweep_command,
            "inspect": inspect_command,
            "failed": failed_command,
            "replay": replay_command,
            "ttl": ttl_command,
            "worker": worker_command,
        }[args.command]
        return command(args)
    except ReceiverError as exc:
        print(f"receiver: {exc}", file=sys.stderr)
        return 2


def serve(args: argparse.Namespace) -> int:
    if args.config:
        _config_receiver(args)  # report configuration errors before uvicorn starts
        # Each worker process builds its own Receiver from the file (receiver/_config.py).
        os.environ["RECEIVER_CONFIG"] = os.path.abspath(args.config)
        if args.store:
            os.environ["RECEIVER_STORE"] = args.store
        app, factory = "receiver._config:_app_from_environment", True
    else:
        _check_store_applies(args)
        os.environ["RECEIVER_STORE"] = args.store or DEFAULT_STORE
        if args.app == DEFAULT_APP and not os.environ.get("RECEIVER_SECRET"):
            secret = generate_secret()
            os.environ["RECEIVER_SECRET"] = secret
            url = f"http://{args.host}:{args.port}/demo"
            print(
                "No RECEIVER_SECRET set: generated a demo secret for provider 'demo'.\n"
                f"  export RECEIVER_SECRET={secret}\n"
                "Try it (run the same line twice to see the replay):\n"
                f"  receiver send --url {url} --secret {secret} --id msg_demo_1\n",
                flush=True,
            )
        # Import once here so configuration errors are reported before uvicorn starts.
        _load_app(args.app)
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


def _check_store_applies(args: argparse.Namespace) -> None:
    """``--store`` reaches the demo app (which reads RECEIVER_STORE) and a ``--config`` file;
    an app of your own builds its Receiver with its own store, so refuse rather than ignore it.
    RECEIVER_STORE alone is not refused: an application may read it itself, as the demo does."""
    given = args.store is not None and args.store != os.environ.get("RECEIVER_STORE")
    if given and args.app != DEFAULT_APP:
        raise ReceiverError(
            f"--store is not applied to --app {args.app}: that Receiver was built with its own "
            "store. Give the store in your code (Receiver(store=...), e.g. from "
            "os.environ['RECEIVER_STORE']), or use --config FILE, whose store --store overrides"
        )


def _load_app(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ReceiverError(f"--app must be module:attribute, not {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ReceiverError(f"module {module_name!r} has no attribute {attr!r}") from None


def _load_receiver(spec: str) -> Receiver:
    app = _load_app(spec)
    if not isinstance(app, Receiver):
        raise ReceiverError(
            f"--app {spec} is a {type(app).__name__}, not a Receiver: point --app at the "
            "Receiver object itself (e.g. myapp:rx)"
        )
    return app


def _build_receiver(spec: str, store: str | None) -> Receiver:
    """``--app module:factory --factory``: the Receiver a function builds, as uvicorn's
    ``--factory`` does; ``--store`` reaches it as its ``store`` argument."""
    factory = _load_app(spec)
    if not callable(factory):
        raise ReceiverError(f"--factory: {spec} is a {type(factory).__name__}, not a function")
    if store is not None:
        try:
            inspect.signature(factory).bind(store=store)
        except TypeError:
            raise ReceiverError(
                f"--store is given but {spec} takes no 'store' argument: define it as "
                "def build(store: str | None = None) -> Receiver"
            ) from None
        app = factory(store=store)
    else:
        app = factory()
    if not isinstance(app, Receiver):
        raise ReceiverError(f"--factory: {spec}() returned a {type(app).__name__}, not a Receiver")
    return app


async def _sweep_store(url: str, batch: int) -> SweepReport:
    """One pass of the sweeper an app without a Receiver has (receiver/_sweeper.py)."""
    async with store_from_url(url) as store:
        return await KeySweeper(store, {}, None).run_once(batch=batch)


def _config_receiver(args: argparse.Namespace) -> Receiver:
    """The Receiver of ``--config``: providers, secrets, handlers, and the file's store unless
    ``--store`` or RECEIVER_STORE (also for ``sweep``, which has no --store) overrides it."""
    _check_config_alone(args)
    sys.path.insert(0, os.getcwd())  # handler modules resolve as --app's module does
    store = getattr(args, "store", None) or os.environ.get("RECEIVER_STORE") or None
    return load_config(args.config).receiver(store=store)


def _check_config_alone(args: argparse.Namespace) -> None:
    if args.app != DEFAULT_APP:
        raise ReceiverError(
            f"--config and --app {args.app} (or RECEIVER_APP) both say what to run: list the "
            'handler modules in the file (handlers = ["module"]) and drop --app'
        )


def sweep_command(args: argparse.Namespace) -> int:
    if args.store and not args.config:
        if args.app != DEFAULT_APP:
            raise ReceiverError(
                "--store sweeps a store without an app, --app sweeps with the app's handlers: "
                "give one of them (the app's own store is the one it is built with)"
            )
        report = asyncio.run(_sweep_store(args.store, args.batch))
    else:
        rx = _config_receiver(args) if args.config else _load_receiver(args.app)

        async def run() -> SweepReport:
            async with rx:
                return await rx.sweep(batch=args.batch)

        report = asyncio.run(run())
    print(
        f"recovered {report.recovered}, failed {report.failed}, released {report.released}, "
        f"skipped {report.skipped}, deleted {report.deleted} expired"
    )
    return 0


def worker_command(args: argparse.Namespace) -> int:
    """Run a worker until SIGTERM or SIGINT, then stop gracefully (receiver/_worker.py)."""
    logging.config.dictConfig(logging_config(args.log_format, args.log_level))
    if args.config:
        rx = _config_receiver(args)
    elif args.factory:
        rx = _build_receiver(args.app, args.store)
    else:
        _check_store_applies(args)
        if args.store:
            os.environ["RECEIVER_STORE"] = args.store
        rx = _load_receiver(args.app)
    _positive("--concurrency", args.concurrency)
    _positive("--stale-interval", args.stale_interval)
    if rx.store.dialect == "sqlite":
        print(
            "receiver: worker on SQLite: run a single worker process (SQLite has one writer)",
            file=sys.stderr,
        )

    async def run() -> None:
        worker = rx.worker(
            concurrency=args.concurrency,
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
            print(f"receiver: worker started on {rx.store.url}", file=sys.stderr, flush=True)
            await worker.run()
        finally:
            await rx.close()
        print(f"receiver: worker stopped: {worker.done}", file=sys.stderr, flush=True)

    asyncio.run(run())
    return 0


def _serve_metrics(rx: Receiver, port: int) -> None:
    """The worker's own counters (attempts, dead letters, lag) on ``/metrics``."""
    from prometheus_client import start_http_server

    assert rx.metrics is not None
    start_http_server(port, registry=rx.metrics.registry)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def _text_argument(name: str, value: str) -> str:
    """A command-line value that is stored as text: it must be valid UTF-8 (the shell may
    hand over any bytes, which Python keeps as surrogate escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
        raise ReceiverError(
            f"{name} '{shown}' is not valid UTF-8 text; no receipt can have it"
        ) from None
    return value


def _positive(name: str, value: int) -> int:
    if value <= 0:
        raise ReceiverError(f"{name} must be a positive number, not {value}")
    return value


def _existing_store(url: str) -> Store:
    """The store of a command that only reads receipts: a SQLite path that does not exist is
    a typo to report, not a new empty database to create."""
    store = store_from_url(url)
    if isinstance(store, SQLiteStore) and not os.path.exists(store.path):
        raise ReceiverError(
            f"no SQLite database at {store.path} (from --store {url}); check the path: "
            "`receiver serve` creates the file with its first start"
        )
    return store


T = TypeVar("T")


def _read(store: Store, run: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a read of the ledger; the database's own refusal (no such database or role, no
    tables yet) is one line, not a driver traceback. Only the error's class and first line are
    shown: these reads carry no payload values."""
    try:
        return asyncio.run(run())
    except (asyncpg.PostgresError, sqlite3.Error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        hint = ""
        if "receiver_receipts" in first or isinstance(exc, asyncpg.UndefinedTableError):
            hint = f"; create the tables first: receiver migrate --store {store.url}"
        raise ReceiverError(
            f"cannot read the receipts in {store.url}: {type(exc).__name__}: {first}{hint}"
        ) from exc
    except StoreMisconfigured as exc:
        # Already classified at the store's boundary, with the fix; name the store to fix.
        hint = f" --store {store.url}" if "receiver migrate" in str(exc) else ""
        raise ReceiverError(
            f"{exc}".replace("receiver migrate`", f"receiver migrate{hint}`")
        ) from exc


def inspect_command(args: argparse.Namespace) -> int:
    provider = _text_argument("provider", args.provider)
    webhook_id = _text_argument("webhook id", args.webhook_id)
    if args.principal is not None:
        if keyed.namespace(provider) != keyed.IDEMPOTENCY:
            raise ReceiverError("--principal is for Idempotency-Keys: PROVIDER idem:NAMESPACE")
        principal = _text_argument("--principal", args.principal)
        webhook_id = orjson.dumps([principal, webhook_id]).decode()
    store = _existing_store(args.store)

    async def run() -> tuple[Receipt | None, list[Row]]:
        async with store, store.acquire() as conn:
            receipt = await ledger.lookup(conn, Key(provider, webhook_id))
            attempts = await conn.run_all("list_attempts", provider, webhook_id)
            return receipt, attempts

    receipt, attempts = _read(store, run)
    if receipt is None:
        print(f"no receipt for {args.provider}/{args.webhook_id}", file=sys.stderr)
        return 1
    print(f"receipt      {args.provider}/{args.webhook_id}")
    print(f"kind         {_kind(provider, webhook_id)}")
    review = " - NEEDS REVIEW by a person" if keyed.needs_review(receipt) else ""
    print(f"state        {receipt.state.value} (fence {receipt.fence}){review}")
    print(f"event type   {receipt.event_type or '-'}")
    print(f"claimed at   {_when(receipt.claimed_at)}")
    print(f"lease until  {_when(receipt.lease_until)}")
    print(f"completed at {_when(receipt.completed_at)}")
    print(f"expires at   {_when(receipt.expires_at)}")
    print(f"payload hash {receipt.payload_hash.hex()}")
    print(f"attempts     {receipt.attempts} failed")
    for attempt in attempts:
        print(f"  fence {attempt['fence']} at {_when(attempt['failed_at'])}: {attempt['error']}")
    if receipt.response is not None:
        r = receipt.response
        print(f"response     {r.status} {r.content_type} ({len(r.body)} bytes)")
        print("  " + r.body[:2000].decode("utf-8", "replace"))
    return 0


def failed_command(args: argparse.Namespace) -> int:
    provider = _text_argument("--provider", args.provider)
    limit = _positive("--limit", args.limit)
    store = _existing_store(args.store)

    async def run() -> list[Row]:
        async with store, store.acquire() as conn:
            return await conn.run_all("list_failed", provider, limit)

    rows = _read(store, run)
    if not rows:
        print("no failed receipts")
        return 0
    for row in rows:
        error = (row["last_error"] or "").splitlines()[0][:80] if row["last_error"] else "-"
        kind = {keyed.ACTION: "action", keyed.IDEMPOTENCY: "idempotency-key"}.get(
            keyed.namespace(row["provider"]) or "", "webhook"
        )
        print(
            f"{row['provider']}/{row['webhook_id']}  {row['state']}  kind={kind}  "
            f"type={row['event_type']}  attempts={row['attempts']}  "
            f"claimed={_when(row['claimed_at'])}  {error}"
        )
    print(
        "webhooks: replay one with receiver replay PROVIDER WEBHOOK_ID --app mod:attr, all of "
        "them with receiver replay --all-failed --app mod:attr; actions and Idempotency-Keys "
        "run again when their caller retries (receiver inspect PROVIDER KEY for details)",
        file=sys.stderr,
    )
    return 0


def _kind(provider: str, webhook_id: str) -> str:
    """What a ledger row is, for people: a webhook delivery, an agent action or a keyed
    request (their rows share the ledger under a namespaced provider)."""
    namespace = keyed.namespace(provider)
    if namespace == keyed.ACTION:
        return f"agent action of tool {provider.partition(':')[2]} (actions.inspect(key) in code)"
    if namespace == keyed.IDEMPOTENCY:
        try:
            principal, key = orjson.loads(webhook_id)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return "Idempotency-Key request"
        return (
            f"Idempotency-Key request of {provider.partition(':')[2]}: principal {principal!r}, "
            f"key {key!r}"
        )
    return "webhook delivery"


def replay_command(args: argparse.Namespace) -> int:
    if args.all_failed == bool(args.target) or len(args.target) not in (0, 2):
        raise ReceiverError(
            "replay takes PROVIDER WEBHOOK_ID, or --all-failed [--provider P] [--limit N]"
        )
    _positive("--limit", args.limit)
    for index, value in enumerate(args.target):
        _text_argument("provider" if index == 0 else "webhook id", value)
    _text_argument("--provider", args.provider)
    rx = _config_receiver(args) if args.config else _load_receiver(args.app)

    async def run() -> int:
        async with rx:
            if args.target:
                keys = [Key(*args.target)]
            else:
                keys = await failed_keys(rx, args.provider, args.limit)
                if not keys:
                    print("no failed receipts to replay")
                    return 0
            progress = _Progress(len(keys)) if args.all_failed and sys.stderr.isatty() else None
            done: dict[str, int] = {}
            async for key, result in replay_all(rx, keys):
                name = f"{key.provider}/{key.webhook_id}"
                if isinstance(result, ReplayRefused):
                    outcome, line = "refused", f"refused: {result}"
                else:
                    outcome, line = result.outcome.value, f"{name}: {_replayed(result)}"
                done[outcome] = done.get(outcome, 0) + 1
                if progress is not None:
                    progress.step(f"{name} {outcome}")
                else:
                    print(line, file=sys.stderr if outcome == "refused" else sys.stdout)
                if args.target and not isinstance(result, ReplayRefused):
                    print(bytes(result.response.body)[:2000].decode("utf-8", "replace"))
            if progress is not None:
                progress.close()
            if args.all_failed:
                summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(done.items()))
                print(f"replayed {len(keys)}: {summary}")
            ok = {Outcome.EXECUTED, Outcome.IGNORED, Outcome.INVALID, Outcome.RECONCILED}
            return 0 if set(done) <= {o.value for o in ok} else 1

    return asyncio.run(run())


def _replayed(reply: Reply) -> str:
    return f"{reply.outcome.value} (HTTP {reply.response.status_code}, fence {reply.fence})"


class _Progress:
    """A one-line progress bar on a terminal (stderr)."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width, self.count = total, width, 0

    def step(self, label: str) -> None:
        self.count += 1
        filled = self.width * self.count // self.total
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r[{bar}] {self.count}/{self.total} {label[:60]:<60}")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


def ttl_command(args: argparse.Namespace) -> int:
    first = "provider"
    if args.config:
        if args.app:
            _check_config_alone(args)
        windows = [p.window for p in load_config(args.config).providers]
    elif args.app:
        windows = [p.window for p in _load_receiver(args.app).providers.values()]
    else:
        # No receiver named: what each preset would give with the default review margin.
        first = "preset"
        windows = [dedup_window(schedule, provider=name) for name, schedule in PRESETS.items()]
    rows = [describe(window) for window in windows]
    for row in rows:
        row[first] = row.pop("provider")
    columns = [first, "schedule", "span", "margin", "window", "source"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip())
    return 0


def migrate(args: argparse.Namespace) -> int:
    url = args.store or (load_config(args.config).store if args.config else DEFAULT_STORE)
    store = store_from_url(url)
    if isinstance(store, SQLiteStore):
        store.auto_migrate = False  # this command applies (or checks) them itself

    async def run() -> int:
        async with store:
            if args.check:
                missing = await store.missing_migrations()
                if missing:
                    print(
                        f"receiver: the schema in {store.url} is behind: missing "
                        f"{', '.join(missing)} (run `receiver migrate`)",
                        file=sys.stderr,
                    )
                    return 1
                print(f"schema up to date in {store.url}")
                return 0
            for name in await store.migrate():
                print(f"applied {name}")
            print(f"schema ready in {store.url}")
            return 0

    return asyncio.run(run())


def send(args: argparse.Namespace) -> int:
    """Sign and POST one delivery. Exit status: 0 for a 2xx answer, 1 for any other answer or
    no answer (as ``curl --fail``), 2 for a mistake on the command line."""
    if not args.secret:
        print("receiver send: --secret (or RECEIVER_SECRET) is required", file=sys.stderr)
        return 2
    webhook_id = args.id or f"msg_{uuid.uuid4().hex}"
    if args.data is None:
        # Named after the id: a new id is a new event, never the same payload under another id
        # (which the receiver reports as key drift), and the same id is the same payload.
        data: Any = {"order_id": f"o-{webhook_id.removeprefix('msg_')}", "amount_cents": 1250}
    else:
        try:
            data = orjson.loads(args.data)
        except orjson.JSONDecodeError as exc:
            print(f"receiver send: --data is not JSON: {exc}", file=sys.stderr)
            return 2
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    body = orjson.dumps({"type": args.type, "data": data})
    try:
        signature = sign(args.secret, webhook_id, timestamp, body)
    except ConfigurationError:
        print(
            "receiver send: --secret is not a signing secret: give the provider's whsec_... "
            "secret (or whsk_... for ed25519) exactly as the receiver has it, e.g. the one "
            "`receiver serve` printed",
            file=sys.stderr,
        )
        return 2
    headers = {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }
    try:
        response = httpx.post(args.url, content=body, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        print(f"receiver send: {args.url}: {exc}", file=sys.stderr)
        return 1
    print(f"POST {args.url}  webhook-id: {webhook_id}")
    print(f"HTTP {response.status_code}")
    for name in ("content-type", "idempotent-replayed", "retry-after"):
        if name in response.headers:
            print(f"{name}: {response.headers[name]}")
    print()
    print(response.text)
    return 0 if response.is_success else 1
