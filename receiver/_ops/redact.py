"""Describe a failed attempt's exception without the payload values a driver puts in its text.

A database driver echoes the values of a failed statement: PostgreSQL's DETAIL of a unique
violation (``Key (email)=(alice@example.com) already exists``), a cast's error (``invalid input
syntax for type integer: "4111 1111 1111 1111"``). Those values are the payload, and the
description ends in ``last_error``, ``receiver_attempts.error`` and the logs. So a driver error
is described by what an operator needs and nothing else: its class, its SQLSTATE (or SQLite's
error name), the constraint, table and column it names, and its message with every quoted
part masked. Any other exception is described by its class and its message with the secrets in
it masked (receiver/_secrets.py): a handler's ``ValueError("login failed: password=hunter2")``
is kept as ``ValueError: login failed: password=•••``.
"""

from __future__ import annotations

import re
import sqlite3
import traceback

import asyncpg

from .._secrets import mask_text

# A quoted part of a driver's message: "..." (PostgreSQL identifiers and values) or '...'.
_QUOTED = re.compile(r""""(?:[^"]|"")*"|'(?:[^']|'')*'""")

_MAX = 2000


def is_driver_error(exc: BaseException) -> bool:
    """True if ``exc``, or any exception it was raised from, came from a database driver."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, asyncpg.PostgresError | sqlite3.Error):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def describe(exc: BaseException) -> str:
    """One line for ``last_error`` and the attempts: class and message; for a driver error,
    the masked message and the names it carries, never the values."""
    name = type(exc).__name__
    if isinstance(exc, asyncpg.PostgresError):
        fields = [f"SQLSTATE {exc.sqlstate}"]
        for label, value in (
            ("constraint", exc.constraint_name),
            ("table", exc.table_name),
            ("column", exc.column_name),
        ):
            if value:
                fields.append(f"{label} {value}")
        text = f"{name}: {_masked(str(exc.message))} ({', '.join(fields)})"
    elif isinstance(exc, sqlite3.Error):
        # SQLite names the constraint's table and column in the message ("UNIQUE constraint
        # failed: people.email"), never the values.
        code = getattr(exc, "sqlite_errorname", None)
        text = f"{name}: {_masked(str(exc))}" + (f" ({code})" if code else "")
    elif is_driver_error(exc):
        text = f"{name} (raised from a database error; its text is withheld)"
    else:
        # Masked before the cut below (never half a secret left), but only as much as is kept.
        text = f"{name}: {mask_text(message(exc)[: 2 * _MAX])}"
    # NUL cannot be stored in PostgreSQL text; the description is for people anyway.
    return text.replace("\x00", "\\x00")[:_MAX]


def message(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception's own ``__str__`` raises: describing a
    failure must not fail in turn (the claim it is about would never be given back)."""
    try:
        return str(exc)
    except Exception:
        return "(its message could not be read)"


def stack(exc: BaseException) -> str:
    """Where ``exc`` was raised (file, line, code), without any exception's message."""
    return "".join(traceback.format_tb(exc.__traceback__)).rstrip()


def _masked(message: str) -> str:
    return _QUOTED.sub(
        lambda m: m.group(0)[0] + "…" + m.group(0)[0], (message.splitlines() or [""])[0]
    )
