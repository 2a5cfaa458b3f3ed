"""``--json``: what a command reports, as one JSON document on stdout, for scripts and CI.

The documents carry the same facts as the text, under stable keys, and mask what the text
masks (errors through receiver/_console/redaction.py); the exit status is the text's.
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from .loading import when


def add_json(parser: argparse.ArgumentParser, fields: str) -> None:
    """The ``--json`` flag, its help naming the document's fields."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document on stdout instead of the text (the same exit status): "
        + fields,
    )


def emit(document: dict[str, Any]) -> None:
    print(orjson.dumps(document).decode())


def instant(seconds: float | None) -> str | None:
    """A time as the text shows it (ISO 8601 UTC to the second, "never" for the ledger's
    infinity), null for none."""
    return None if seconds is None else when(seconds)
