"""Stores by URL: ``postgresql://...`` or ``sqlite:///path.db``.

Apart from receiver/_store/base.py so that the seam does not import its implementations (each of
which imports the seam).
"""

from __future__ import annotations

import re

from .._exceptions import ConfigurationError
from .base import Store
from .postgres import PostgresStore
from .sqlite import SQLiteStore

_EXAMPLES = "postgresql://user@host/db or sqlite:///path/to/receiver.db"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")  # RFC 3986: no user or password in it


def store_from_url(url: str) -> Store:
    """Build a store from a URL: ``postgresql://...`` or ``sqlite:///path/to/file.db``."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")
        # sqlite:///relative.db -> "relative.db"; sqlite:////abs/path.db -> "/abs/path.db"
        path = path[1:] if path.startswith("/") else path
        if not path:
            # SQLite would open a temporary file, deleted at close: a ledger that forgets.
            raise ConfigurationError(
                f"store URL {url!r} names no file: write sqlite:///receiver.db (relative), "
                "sqlite:////var/lib/receiver.db (absolute) or sqlite:///:memory:"
            )
        return SQLiteStore(path)
    scheme, found, _ = url.partition("://")
    if url and ":" not in url and "@" not in url:  # a file's path: shown, in its URL
        raise ConfigurationError(
            f"store URL {url!r} has no scheme: for a SQLite file write sqlite:///{url}, for "
            "PostgreSQL postgresql://user@host/db"
        )
    # Neither shows the URL: "postgresql:/app:s3cret@db/app" (one slash), "mysql://app:s3cret@db"
    # or "mysql://db/app?password=s3cret" holds a password, which no parse can be sure to find.
    if not found or _SCHEME.fullmatch(scheme) is None:
        raise ConfigurationError(
            f"the store URL has no scheme (no '://' after a name): use {_EXAMPLES}"
        )
    raise ConfigurationError(f"unsupported store URL scheme {scheme!r}: use {_EXAMPLES}")
