"""``receiver console``: the operator console served alone, behind a token.

The token comes from ``RECEIVER_CONSOLE_TOKEN`` or ``--token-file`` (never the command line,
which other users of the machine can read). With ``--app`` or ``--config`` the console replays
with that Receiver's handlers; with ``--store`` alone it shows the ledger and settles what
needs review, but cannot run handlers.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from .._console import Console
from .._exceptions import ReceiverError
from .loading import DEFAULT_APP, config_receiver, load_receiver

TOKEN_ENV = "RECEIVER_CONSOLE_TOKEN"  # noqa: S105 (the variable's name, not a token)


def add_console_parser(sub: Any, add: Callable[..., None]) -> None:
    """The ``console`` subcommand (``add`` is the parser's option helper: env var defaults)."""
    parser = sub.add_parser(
        "console", help="serve the operator console (needs RECEIVER_CONSOLE_TOKEN or a token file)"
    )
    add(parser, "store", "store URL (default: the --app's or --config file's store)")
    add(parser, "app", "a Receiver, module:attribute, whose handlers replays run")
    add(parser, "config", "a TOML file whose Receiver's handlers replays run (instead of --app)")
    add(parser, "host", "interface to bind", "127.0.0.1")
    add(parser, "port", "port to bind", 8100, type=int)
    add(parser, "token-file", f"a file holding the token (else the env var {TOKEN_ENV})")
    add(parser, "log-level", "uvicorn log level", "info")
    for flag, help in (
        ("read-only", "show everything, change nothing"),
        ("show-payloads", "show payloads and stored answers (redacted); hidden by default"),
    ):
        env = f"RECEIVER_{flag.upper().replace('-', '_')}"
        parser.add_argument(
            f"--{flag}",
            action="store_true",
            default=os.environ.get(env, "") not in ("", "0", "false"),
            help=f"{help} [env {env}]",
        )


def read_token(token_file: str | None) -> str:
    if token_file:
        try:
            token = Path(token_file).read_text("utf-8").strip()
        except OSError as exc:
            raise ReceiverError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ReceiverError(
            f"the console needs a token: set {TOKEN_ENV}, or pass --token-file PATH (a file "
            "holding it); mounted inside your app instead (rx.console()), it trusts your app's "
            "authentication"
        )
    return token


def build_console(args: argparse.Namespace) -> Console:
    token = read_token(args.token_file)
    options: dict[str, Any] = {
        "token": token,
        "read_only": args.read_only,
        "show_payloads": args.show_payloads,
    }
    if args.config:
        if args.app:
            raise ReceiverError("--config and --app both say which handlers: give one")
        args.app = DEFAULT_APP  # what config_receiver takes for "no --app"
        rx = config_receiver(args)
        return Console(rx.store, receiver=rx, **options)
    if args.app:
        rx = load_receiver(args.app)
        if args.store and args.store != rx.store.url:
            raise ReceiverError(
                f"--store {args.store} is not the store of --app {args.app} ({rx.store.url}): "
                "give one of them"
            )
        return Console(rx.store, receiver=rx, **options)
    if not args.store:
        raise ReceiverError("say which ledger: --store URL (or --app / --config)")
    return Console(args.store, **options)


def console_command(args: argparse.Namespace) -> int:
    console = build_console(args)
    uvicorn.run(console, host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
    return 0
