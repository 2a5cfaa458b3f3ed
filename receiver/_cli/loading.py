"""What the commands share: finding the app or the Receiver a command runs (``--app``,
``--factory``, ``--config``), opening a store that must exist, and checking arguments."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import inspect
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import asyncpg

from .._config.loader import load_config
from .._exceptions import ReceiverError, StoreMisconfigured
from .._store.base import Store
from .._store.sqlite import SQLiteStore
from .._store.url import store_from_url
from .._webhooks.app import DEFAULT_STORE, Receiver


def check_store_applies(args: argparse.Namespace) -> None:
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


def load_app(spec: str, option: str = "--app") -> Any:
    """The object ``spec`` (module:attribute) names; ``option`` is the option that gave it, as
    errors name it."""
    module_name, _, attr = spec.partition(":")
    if not attr or not all(part.isidentifier() for part in module_name.split(".")):
        raise ReceiverError(f"{option} must be module:attribute (e.g. myapp:rx), not {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the module --app names (or a package on its path) is a mistake in --app; a
        # module that it imports and that is missing is its own bug, with its traceback.
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise
        if spec == DEFAULT_APP:
            raise ReceiverError(
                "no app to run: give --app module:attribute (your Receiver, e.g. myapp:rx) or "
                f"--config FILE. Without them it runs the demo app, {DEFAULT_APP}, which is in "
                "the repository, not in the package: scripts/serve runs it from a clone"
            ) from None
        raise ReceiverError(
            f"{option} {spec}: no module named {exc.name!r} (from {os.getcwd()} and the "
            "installed packages); check the name, or run from the directory that holds it"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ReceiverError(f"module {module_name!r} has no attribute {attr!r}") from None


def load_receiver(spec: str) -> Receiver:
    app = load_app(spec)
    if not isinstance(app, Receiver):
        raise ReceiverError(
            f"--app {spec} is a {type(app).__name__}, not a Receiver: point --app at the "
            "Receiver object itself (e.g. myapp:rx)"
        )
    return app


def build_receiver(spec: str, store: str | None) -> Receiver:
    """``--app module:factory --factory``: the Receiver a function builds, as uvicorn's
    ``--factory`` does; ``--store`` reaches it as its ``store`` argument."""
    factory = load_app(spec)
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
        try:
            inspect.signature(factory).bind()
        except TypeError:
            # Said before the call: a TypeError the factory raises itself is its own bug.
            raise ReceiverError(
                f"--factory: {spec} needs arguments; the command calls it as {spec}() (or "
                f"{spec}(store=URL) with --store)"
            ) from None
        except ValueError:  # no signature to check (some builtins): the call will tell
            pass
        app = factory()
    if not isinstance(app, Receiver):
        raise ReceiverError(f"--factory: {spec}() returned a {type(app).__name__}, not a Receiver")
    return app


def config_receiver(args: argparse.Namespace) -> Receiver:
    """The Receiver of ``--config``: providers, secrets, handlers, and the file's store unless
    ``--store`` or RECEIVER_STORE (also for ``sweep``, which has no --store) overrides it."""
    check_config_alone(args)
    sys.path.insert(0, os.getcwd())  # handler modules resolve as --app's module does
    store = getattr(args, "store", None) or os.environ.get("RECEIVER_STORE") or None
    return load_config(args.config).receiver(store=store)


def store_url(args: argparse.Namespace) -> str:
    """The store a command that needs no handlers works on: ``--store``, else the ``--config``
    file's, else the default SQLite file."""
    if args.store:
        return str(args.store)
    return load_config(args.config).store if args.config else DEFAULT_STORE


def check_config_alone(args: argparse.Namespace) -> None:
    if args.app != DEFAULT_APP:
        raise ReceiverError(
            f"--config and --app {args.app} (or RECEIVER_APP) both say what to run: list the "
            'handler modules in the file (handlers = ["module"]) and drop --app'
        )


def when(seconds: float | None) -> str:
    """UTC time to the second; '-' for none, 'never' for the ledger's infinity (a queued
    receipt's expiry: it has no window until it finishes)."""
    if seconds is None:
        return "-"
    if not math.isfinite(seconds) or abs(seconds) >= 1e12:
        return "never"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def text_argument(name: str, value: str, why: str = "no receipt can have it") -> str:
    """A command-line value that is stored as text: it must be valid UTF-8 (the shell may
    hand over any bytes, which Python keeps as surrogate escapes); ``why`` ends the error."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
        raise ReceiverError(f"{name} '{shown}' is not valid UTF-8 text; {why}") from None
    return value


def existing_store(url: str) -> Store:
    """The store of a command that only reads receipts: a SQLite path that does not exist is
    a typo to report, not a new empty database to create."""
    store = store_from_url(url)
    if isinstance(store, SQLiteStore) and not os.path.exists(store.path):
        raise ReceiverError(
            f"no SQLite database at {store.path} (from --store {url}); check the path: "
            "`receiver serve` creates the file with its first start"
        )
    return store


#: What ``--app`` runs unless told otherwise: the demo app of the repository's handlers/, found
#: from the working directory or PYTHONPATH (it is not part of the package); without it, a
#: command given neither --app nor --config says what to give.
DEFAULT_APP = "handlers:app"

T = TypeVar("T")


def read(
    store: Store, run: Callable[[], Coroutine[Any, Any, T]], doing: str = "read the receipts in"
) -> T:
    """Run a command's work on the ledger; the database's own refusal (no such database or
    role, no tables yet, a file that is not a SQLite database) is one line, not a driver
    traceback. Only the error's class and first line are shown: these statements carry no
    payload values. ``doing`` says what could not be done (``cannot {doing} URL``)."""
    try:
        return asyncio.run(run())
    except (asyncpg.PostgresError, sqlite3.Error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        hint = ""
        if "receiver_receipts" in first or isinstance(exc, asyncpg.UndefinedTableError):
            hint = f"; create the tables first: receiver migrate --store {store.url}"
        raise ReceiverError(
            f"cannot {doing} {store.url}: {type(exc).__name__}: {first}{hint}"
        ) from exc
    except StoreMisconfigured as exc:
        # Already classified at the store's boundary, with the fix; name the store to fix.
        hint = f" --store {store.url}" if "receiver migrate" in str(exc) else ""
        raise ReceiverError(
            f"{exc}".replace("receiver migrate`", f"receiver migrate{hint}`")
        ) from exc
