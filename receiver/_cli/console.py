"""``receiver console``: the operator console served alone, behind a token.

The token comes from ``RECEIVER_CONSOLE_TOKEN`` or ``--token-file`` (never the command line,
which other users of the machine can read); ``--console-operators FILE`` names operators
instead, each with a token of their own and a role (a TOML file of ``[[operator]]`` tables:
``name``, ``role`` = ``"operator"`` or ``"read-only"``, and ``token_sha256`` or ``token``).
``--end-sessions`` ends every console session in the ledger and exits. With ``--app`` or
``--config`` the console replays with that Receiver's handlers; with ``--store`` alone it shows
the ledger and settles what needs review, but cannot run handlers.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from .._console import Console, sessions
from .._exceptions import ReceiverError
from .._logging import FORMAT_HELP, FORMATS, logging_config
from . import values
from .loading import DEFAULT_APP, config_receiver, existing_store, load_receiver, read
from .receipts import default_actor

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
    add(parser, "port", "port to bind", 8100, type=values.port)
    add(parser, "token-file", f"a file holding the token (else the env var {TOKEN_ENV})")
    add(parser, "console-operators", "a TOML file of [[operator]] tables: name, role, token_sha256")
    add(
        parser, "bulk-rate", "deliveries a second a bulk replay runs at", 20.0, type=values.positive
    )
    add(parser, "log-level", "uvicorn log level", "info", type=values.log_level)
    add(parser, "log-format", FORMAT_HELP, "auto", choices=FORMATS)
    parser.add_argument(
        "--end-sessions",
        action="store_true",
        help="end every console session in the ledger (everyone signs in again), and exit",
    )
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


def read_operators(path: str) -> list[dict[str, str]]:
    """The ``[[operator]]`` tables of a TOML file."""
    try:
        doc = tomllib.loads(Path(path).read_text("utf-8"))
    except OSError as exc:
        raise ReceiverError(f"cannot read --console-operators {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ReceiverError(f"--console-operators {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ReceiverError(f"--console-operators {path} is not valid TOML: {exc}") from None
    entries = doc.get("operator")
    if not isinstance(entries, list) or not entries or set(doc) != {"operator"}:
        raise ReceiverError(
            f"--console-operators {path} must hold [[operator]] tables only (name, role, "
            "token_sha256)"
        )
    found = []
    for entry in entries:
        if not isinstance(entry, dict):  # operator = [1, 2]: an array, not tables
            raise ReceiverError(
                f"--console-operators {path} must hold [[operator]] tables only (name, role, "
                "token_sha256)"
            )
        unknown = set(entry) - {"name", "role", "token", "token_sha256"}
        if unknown or not all(isinstance(v, str) for v in entry.values()):
            raise ReceiverError(
                f"--console-operators {path}: an operator has unknown or non-text keys "
                f"({', '.join(sorted(unknown)) or 'a value is not a string'})"
            )
        found.append(dict(entry))
    return found


def read_token(token_file: str | None) -> str:
    if token_file:
        try:
            token = Path(token_file).read_text("utf-8").strip()
        except OSError as exc:
            raise ReceiverError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
        except UnicodeDecodeError:  # the message would show the token's bytes: never shown
            raise ReceiverError(f"--token-file {token_file} is not UTF-8 text") from None
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
    operators = read_operators(args.console_operators) if args.console_operators else []
    given = args.token_file or os.environ.get(TOKEN_ENV, "").strip()
    token = read_token(args.token_file) if given or not operators else None
    options: dict[str, Any] = {
        "token": token,
        "operators": operators,
        "bulk_rate": args.bulk_rate,
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
    console = Console(args.store, **options)  # its token checked first
    # A SQLite path with a typo is reported, not served as a new, empty ledger.
    existing_store(args.store)
    return console


def console_command(args: argparse.Namespace) -> int:
    if args.end_sessions:
        return end_sessions(args)
    console = build_console(args)
    uvicorn.run(
        console,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=logging_config(args.log_format, args.log_level),
        lifespan="on",
        # Open live pages hold an event stream: they reconnect to the next console.
        timeout_graceful_shutdown=5,
    )
    return 0


def end_sessions(args: argparse.Namespace) -> int:
    """End every console session: each operator's next page asks them to sign in again."""
    if args.config:
        args.app = DEFAULT_APP  # what config_receiver takes for "no --app"
        store = config_receiver(args).store
    elif args.app:
        store = load_receiver(args.app).store
    elif args.store:
        store = existing_store(args.store)
    else:
        raise ReceiverError("say which ledger: --store URL (or --app / --config)")

    async def run() -> int:
        async with store:
            actor = default_actor("receiver console --end-sessions")
            return await sessions.end_all(store, actor, "the command line")

    ended = read(store, run)
    print(f"ended {ended} console session(s): every operator signs in again")
    return 0
