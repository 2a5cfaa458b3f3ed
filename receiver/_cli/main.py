"""The ``receiver`` command's parser and dispatch; each command is in the module of its group
(``processes``, ``receipts``, ``setup``).

Every option can also be given as an environment variable ``RECEIVER_<OPTION>`` (for example
``RECEIVER_STORE``); the command line wins.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from typing import Any

from .._exceptions import ReceiverError
from .._logging import FORMAT_HELP, FORMATS
from .._verification import sending
from .._webhooks.app import DEFAULT_STORE
from . import values
from .bulk import add_bulk_arguments
from .console import add_console_parser, console_command
from .init import add_init_parser, init_command
from .loading import DEFAULT_APP
from .output import add_json
from .processes import serve, sweep_command, worker_command
from .proxy import add_proxy_parser, proxy_command
from .receipts import failed_command, inspect_command, replay_command
from .setup import migrate, send, ttl_command

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
    shown = f"{default}, the demo app of a clone" if default == DEFAULT_APP else default
    parser.add_argument(
        f"--{name}", default=value, help=f"{help} [env {env}; default {shown}]", **kw
    )


def _version() -> str:
    """The installed distribution's version (built from ``receiver.__version__``)."""
    try:
        return importlib.metadata.version("receiver-webhooks")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="receiver", description="Receive webhooks so that each event takes effect once."
    )
    parser.add_argument("--version", action="version", version=f"receiver {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the receiver on uvicorn")
    _add(serve, "app", "the ASGI app to serve, module:attribute", DEFAULT_APP)
    _add(serve, "config", CONFIG_HELP)
    _add(serve, "store", STORE_HELP)
    _add(serve, "host", "interface to bind", "127.0.0.1")
    _add(serve, "port", "port to bind", 8000, type=values.port)
    _add(serve, "workers", "uvicorn worker processes", 1, type=values.count)
    _add(serve, "log-level", "uvicorn log level", "info", type=values.log_level)
    _add(serve, "log-format", FORMAT_HELP, "auto", choices=FORMATS)

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
    migrate.add_argument(
        "--layout",
        choices=("single", "partitioned"),
        default=None,
        help="PostgreSQL: also bring receiver_receipts to this layout (partitioned: expiry "
        "drops a day of receipts at once; single: one table, the default)",
    )
    add_json(
        migrate,
        "with --check, {store, up_to_date, missing: [...], layout} (layout: with --layout, "
        "the one found, else null)",
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
    _add(sweep, "batch", "receipts per batch", 100, type=values.count)
    _add(sweep, "dead-letter-retention", "with --store: dead letters kept after their window (7d)")
    _add(sweep, "audit-retention", "with --store: operators' audit records kept (365d)")
    add_json(sweep, "{recovered, failed, released, skipped, deleted, audit_deleted}")

    worker = sub.add_parser(
        "worker",
        help="run queued deliveries (mode='queued'); any number on one PostgreSQL, one on SQLite",
    )
    _add(worker, "app", "the Receiver whose queued handlers to run, module:attribute", DEFAULT_APP)
    _add(worker, "config", CONFIG_HELP)
    _add(worker, "store", STORE_HELP)
    _add(worker, "concurrency", "attempts run at once by this process", 16, type=values.count)
    _add(
        worker,
        "group",
        "PostgreSQL: at most this many deliveries whose handlers are all transactional share one "
        "transaction (1: each its own)",
        8,
        type=values.count,
    )
    _add(
        worker,
        "poll-interval",
        "seconds between polls when no NOTIFY arrives",
        1.0,
        type=values.positive,
    )
    _add(
        worker,
        "stale-interval",
        "seconds between looks for deliveries a dead worker left in flight (each is taken over "
        "once its lease ran out: at most lease + this after the death)",
        5.0,
        type=values.positive,
    )
    worker.add_argument(
        "--factory",
        action="store_true",
        default=os.environ.get("RECEIVER_FACTORY", "") not in ("", "0", "false"),
        help="--app names a function that builds the Receiver, called as app(store=URL) when "
        "--store is given, else app() [env RECEIVER_FACTORY]",
    )
    _add(
        worker,
        "grace",
        "on SIGTERM, seconds to let running attempts finish",
        30.0,
        type=values.not_negative,
    )
    _add(
        worker,
        "metrics-port",
        "serve Prometheus metrics on this port (0: none)",
        0,
        type=values.port,
    )
    _add(worker, "log-level", "log level", "info", type=values.log_level)
    _add(worker, "log-format", FORMAT_HELP, "auto", choices=FORMATS)

    inspect = sub.add_parser("inspect", help="show one receipt: state, attempts, stored answer")
    inspect.add_argument("provider")
    inspect.add_argument("webhook_id")
    _add(inspect, "config", "take the store from this config file")
    _add(inspect, "store", STORE_HELP)
    inspect.add_argument(
        "--principal",
        default=None,
        help="for an Idempotency-Key (PROVIDER idem:NAMESPACE, WEBHOOK_ID the key): whose key",
    )
    add_json(
        inspect,
        '{"receipt": {provider, webhook_id, kind, state, fence, needs_review, rejected_status, '
        "event_type, claimed_at, lease_until, completed_at, expires_at, payload_hash, attempts, "
        "failed_attempts: [{fence, failed_at, error}], response: {status, content_type, bytes, "
        'body} or null}}; no receipt: {"receipt": null}, exit 1',
    )

    failed = sub.add_parser("failed", help="list receipts whose handlers failed")
    _add(failed, "config", "take the store from this config file")
    _add(failed, "store", STORE_HELP)
    _add(failed, "provider", "only this provider", "")
    _add(failed, "limit", "at most this many", 50, type=values.count)
    add_json(
        failed,
        '{"receipts": [{provider, webhook_id, state, rejected_status, kind, event_type, '
        "attempts, claimed_at, error}]}",
    )

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
    _add(replay, "limit", "with --all-failed: at most this many", 100, type=values.count)
    _add(
        replay, "reason", "why, recorded in the audit with each replay", "given on the command line"
    )
    _add(replay, "actor", "who, recorded in the audit (default: user@host)", "")
    add_bulk_arguments(replay)

    ttl = sub.add_parser(
        "ttl",
        help="explain each provider's retry schedule and dedup window (without --app or "
        "--config: every preset)",
    )
    _add(ttl, "app", "the Receiver whose providers to explain, module:attribute")
    _add(ttl, "config", "explain the providers of this config file (needs no secrets)")
    add_json(
        ttl,
        '{"windows": [{provider (or preset), schedule, attempts, jitter, span, margin, window '
        "(seconds), explicit_ttl, source}]}",
    )

    add_console_parser(sub, _add)
    add_proxy_parser(sub, _add)
    add_init_parser(sub)

    send = sub.add_parser("send", help="sign a delivery and POST it, to try the receiver")
    _add(send, "url", "the provider's endpoint", "http://127.0.0.1:8000/demo")
    _add(
        send,
        "scheme",
        "the sender whose delivery to sign, as the provider's scheme names it",
        "standard-webhooks",
        choices=sending.SCHEMES,
    )
    _add(
        send,
        "secret",
        "the provider's secret as the receiver has it: whsec_... (or whsk_...) for "
        "standard-webhooks and svix, Stripe's whsec_... endpoint secret (used verbatim), the "
        "Auth Token for twilio (which signs --url: give the URL exactly as the provider has "
        "it), the shared secret string for github, shopify, slack, paddle, zoom and linear",
        None,
    )
    _add(
        send,
        "id",
        "the event's id (reuse one to see a replay): webhook-id, Stripe's or Slack's event id, "
        "GitHub's delivery id, ...; zoom and linear key on the signed body, made from it",
        None,
    )
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
    parser = build_parser()
    arguments = sys.argv[1:] if argv is None else list(argv)
    if not arguments:
        # A first try of the command: the help, not argparse's "the following arguments are
        # required: COMMAND".
        parser.print_help()
        return 0
    args = parser.parse_args(arguments)
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
            "console": console_command,
            "proxy": proxy_command,
            "init": init_command,
        }[args.command]
        return command(args)
    except ReceiverError as exc:
        print(f"receiver: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`receiver inspect ... | head`): stop quietly, as cat does, and
        # keep Python from reporting the same broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
