"""The ``receiver`` command: serve, migrate, send.

Every option can also be given as an environment variable ``RECEIVER_<OPTION>`` (for example
``RECEIVER_STORE``); the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from . import _ledger as ledger
from ._app import DEFAULT_STORE, Receiver
from ._exceptions import ReceiverError
from ._ledger import Key, Receipt
from ._schedules import describe
from ._store import Row, store_from_url
from ._sweeper import SweepReport
from ._verification import generate_secret, sign

DEFAULT_APP = "handlers:app"


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
    _add(serve, "store", "store URL: sqlite:///path.db or postgresql://...", DEFAULT_STORE)
    _add(serve, "host", "interface to bind", "127.0.0.1")
    _add(serve, "port", "port to bind", 8000, type=int)
    _add(serve, "workers", "uvicorn worker processes", 1, type=int)
    _add(serve, "log-level", "uvicorn log level", "info")

    migrate = sub.add_parser("migrate", help="create the ledger's tables (idempotent)")
    _add(migrate, "store", "store URL", DEFAULT_STORE)

    sweep = sub.add_parser("sweep", help="one sweeper pass: recover stale claims, delete expired")
    _add(
        sweep,
        "app",
        "the Receiver whose handlers recover stale claims, module:attribute",
        DEFAULT_APP,
    )
    _add(sweep, "batch", "receipts per batch", 100, type=int)

    inspect = sub.add_parser("inspect", help="show one receipt: state, attempts, stored answer")
    inspect.add_argument("provider")
    inspect.add_argument("webhook_id")
    _add(inspect, "store", "store URL", DEFAULT_STORE)

    failed = sub.add_parser("failed", help="list receipts whose handlers failed")
    _add(failed, "store", "store URL", DEFAULT_STORE)
    _add(failed, "provider", "only this provider", "")
    _add(failed, "limit", "at most this many", 50, type=int)

    ttl = sub.add_parser("ttl", help="explain each provider's retry schedule and dedup window")
    _add(ttl, "app", "the Receiver, module:attribute", DEFAULT_APP)

    send = sub.add_parser("send", help="sign a delivery and POST it, to try the receiver")
    _add(send, "url", "the provider's endpoint", "http://127.0.0.1:8000/demo")
    _add(send, "secret", "the provider's whsec_ (or whsk_) secret", None)
    _add(send, "id", "webhook-id (reuse one to see a replay)", None)
    _add(send, "type", "event type", "order.created")
    _add(send, "data", "the event's data, as JSON", '{"order_id": "o-1", "amount_cents": 1250}')
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
            "ttl": ttl_command,
        }[args.command]
        return command(args)
    except ReceiverError as exc:
        print(f"receiver: {exc}", file=sys.stderr)
        return 2


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    os.environ["RECEIVER_STORE"] = args.store
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
    uvicorn.run(
        args.app,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        lifespan="on",
    )
    return 0


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


def sweep_command(args: argparse.Namespace) -> int:
    rx = _load_receiver(args.app)

    async def run() -> SweepReport:
        async with rx:
            return await rx.sweep(batch=args.batch)

    report = asyncio.run(run())
    print(
        f"recovered {report.recovered}, failed {report.failed}, released {report.released}, "
        f"skipped {report.skipped}, deleted {report.deleted} expired"
    )
    return 0


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def inspect_command(args: argparse.Namespace) -> int:
    async def run() -> tuple[Receipt | None, list[Row]]:
        async with store_from_url(args.store) as store, store.acquire() as conn:
            receipt = await ledger.lookup(conn, Key(args.provider, args.webhook_id))
            attempts = await conn.run_all("list_attempts", args.provider, args.webhook_id)
            return receipt, attempts

    receipt, attempts = asyncio.run(run())
    if receipt is None:
        print(f"no receipt for {args.provider}/{args.webhook_id}", file=sys.stderr)
        return 1
    print(f"receipt      {args.provider}/{args.webhook_id}")
    print(f"state        {receipt.state.value} (fence {receipt.fence})")
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
    async def run() -> list[Row]:
        async with store_from_url(args.store) as store, store.acquire() as conn:
            return await conn.run_all("list_failed", args.provider, args.limit)

    rows = asyncio.run(run())
    if not rows:
        print("no failed receipts")
        return 0
    for row in rows:
        error = (row["last_error"] or "").splitlines()[0][:80] if row["last_error"] else "-"
        print(
            f"{row['provider']}/{row['webhook_id']}  {row['state']}  type={row['event_type']}  "
            f"attempts={row['attempts']}  claimed={_when(row['claimed_at'])}  {error}"
        )
    return 0


def ttl_command(args: argparse.Namespace) -> int:
    rx = _load_receiver(args.app)
    rows = [describe(p.window) for p in rx.providers.values()]
    columns = ["provider", "schedule", "span", "margin", "window", "source"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip())
    return 0


def migrate(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with store_from_url(args.store) as store:
            await store.migrate()
            print(f"schema ready in {store.url}")

    asyncio.run(run())
    return 0


def send(args: argparse.Namespace) -> int:
    if not args.secret:
        print("receiver send: --secret (or RECEIVER_SECRET) is required", file=sys.stderr)
        return 2
    try:
        data = orjson.loads(args.data)
    except orjson.JSONDecodeError as exc:
        print(f"receiver send: --data is not JSON: {exc}", file=sys.stderr)
        return 2
    webhook_id = args.id or f"msg_{uuid.uuid4().hex}"
    timestamp = args.timestamp if args.timestamp is not None else int(time.time())
    body = orjson.dumps({"type": args.type, "data": data})
    headers = {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(args.secret, webhook_id, timestamp, body),
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
    return 0 if response.status_code < 500 else 1
