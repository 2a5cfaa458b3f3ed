"""The ledger's SQL, one file per dialect, loaded once by statement name.

Each ``queries.<dialect>.sql`` file is a list of blocks that start with ``-- name: NAME``. Both
dialects define the same names with the same positional parameters, which is what lets
:mod:`receiver._ledger` be written once for every store.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Mapping

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


def _read(filename: str) -> str:
    return importlib.resources.files("receiver").joinpath("sql", filename).read_text("utf-8")


@functools.cache
def queries(dialect: str) -> Mapping[str, str]:
    """The named statements of one dialect."""
    return parse(_read(f"queries.{dialect}.sql"))


@functools.cache
def schema(dialect: str) -> str:
    """The schema of one dialect, as a script of idempotent statements."""
    return _read(f"schema.{dialect}.sql")
