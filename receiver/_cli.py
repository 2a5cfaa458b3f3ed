"""The ``receiver`` command: serve, migrate, send.

Every option can also be given as an environment variable ``RECEIVER_<OPTION>`` (for example
``RECEIVER_STORE``); the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from ._app import DEFAULT_STORE
from ._exceptions import ReceiverError
from ._store import store_from_url
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
        command = {"serve": serve, "migrate": migrate, "send": send}[args.command]
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
