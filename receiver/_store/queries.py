"""The ledger's SQL, one file per dialect, loaded once by statement name.

Each ``queries.<dialect>.sql`` file is a list of blocks that start with ``-- name: NAME``. Both
dialects define the same names with the same positional parameters, which is what lets
:mod:`receiver._ledger.receipts` be written once for every store. ``migrate.<dialect>.sql`` holds
the
migration runner's own statements the same way; the schema itself is the numbered files of
``sql/migrations/<dialect>/`` (receiver/_store/migrations.py).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Mapping, Sequence

DIALECTS = ("postgresql", "sqlite")

_BLOCK = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: statement}``; comments and blank lines are dropped."""
    parts = _BLOCK.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if line.strip() and not line.startswith("--")]
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = "\n".join(lines).rstrip().rstrip(";")
    return queries


def _read(*path: str) -> str:
    return importlib.resources.files("receiver._store").joinpath("sql", *path).read_text("utf-8")


#: The statement files of each dialect, ``<part>.<dialect>.sql``: the ledger's, and the
#: console's sessions, bulk replays and live numbers (kept apart, one concern per file).
PARTS = ("queries", "console")


@functools.cache
def queries(dialect: str) -> Mapping[str, str]:
    """The named statements of one dialect (every part's; a name defined twice is refused)."""
    return parse("\n".join(_read(f"{part}.{dialect}.sql") for part in PARTS))


@functools.cache
def runner_queries(dialect: str) -> Mapping[str, str]:
    """The migration runner's named statements of one dialect."""
    return parse(_read(f"migrate.{dialect}.sql"))


@functools.cache
def layout_queries() -> Mapping[str, str]:
    """The partitioned layout's named statements (PostgreSQL only; receiver/_store/
    partitions.py)."""
    return parse(_read("layouts", "partitioned.postgresql.sql"))


def split_statements(script: str) -> Sequence[str]:
    """Split a migration script into statements (migrations put no ';' inside literals or
    bodies, and no statement inside a comment)."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
