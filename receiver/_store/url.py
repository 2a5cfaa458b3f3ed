"""Stores by URL: ``postgresql://...`` or ``sqlite:///path.db``.

Apart from receiver/_store/base.py so that the seam does not import its implementations (each of
which imports the seam).
"""

from __future__ import annotations

from .._exceptions import ConfigurationError
from .base import Store
from .postgres import PostgresStore
from .sqlite import SQLiteStore

_EXAMPLES = "postgresql://user@host/db or sqlite:///path/to/receiver.db"


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
    if not found:
        hint = f"sqlite:///{url}" if url and ":" not in url else "sqlite:///path/to/receiver.db"
        raise ConfigurationError(
            f"store URL {url!r} has no scheme: for a SQLite file write {hint}, for PostgreSQL "
            "postgresql://user@host/db"
        )
    raise ConfigurationError(
        f"unsupported store URL scheme {scheme!r} in {_redacted(url)!r}: use {_EXAMPLES}"
    )


def _redacted(url: str) -> str:
    """The URL without a password, which may follow ``user:`` before ``@``."""
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
