"""Connecting through a store URL that names several hosts (a primary and its standbys, with
``target_session_attrs=read-write``), and saying what really happened when it fails.

asyncpg tries the next host only when one cannot be reached or cannot take connections yet;
a host that answers with any other server error ends the whole attempt. During a failover
that error can be a wrong diagnosis: the old primary's address may be answered by another
server (an orchestrator's fresh, empty instance, or another cluster on a reused port), which
says "database does not exist" (3D000) or refuses the role (28xxx), and the store would report
its database missing while the promoted standby serves it. So when one host answers so, every
host is tried on its own: the first that serves the database is used, and if none does, the
error is the database's only when every host says so; otherwise the store is unavailable (no
host serves it for now), which senders retry.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import asyncpg

from .._exceptions import ConfigurationError, StoreMisconfigured, StoreUnavailable

__all__ = ["check_url", "connect", "hosts_of"]

# A server that lacks the database or the role: the wrong server, or the wrong URL.
_WRONG_SERVER = ("3D000", "28")


def _items(dsn: str) -> list[tuple[str, str]]:
    """The ``(host, port)`` strings of a ``postgresql://`` URL's netloc, as written."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        return []
    found: list[tuple[str, str]] = []
    for item in parts.netloc.rpartition("@")[2].split(","):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        found.append((host, port))
    return found


def hosts_of(dsn: str) -> list[tuple[str, int]]:
    """The ``host:port`` pairs a ``postgresql://`` URL names (port 5432 where none is given);
    empty for anything else (a key=value DSN, a socket directory in ``?host=``)."""
    return [
        (urllib.parse.unquote(host), int(port) if port.isdigit() else 5432)
        for host, port in _items(dsn)
        if host
    ]


def check_url(dsn: str) -> None:
    """Refuse a ``postgresql://`` URL that cannot name a server (ConfigurationError): one that
    does not parse, or a port that is not a number from 1 to 65535. The message never holds
    the URL (it may hold a password)."""
    if not isinstance(dsn, str):
        raise ConfigurationError(f"the PostgreSQL store URL is a str, not a {type(dsn).__name__}")
    try:
        items = _items(dsn)
    except ValueError:
        # Not the parser's message: it can quote the user and password ("netloc 'app:s3...'").
        raise ConfigurationError(
            "the PostgreSQL store URL does not parse: an unclosed '[' around an IPv6 host, or a "
            "character in the user, password or host that stands for '/', '?', '#', '@' or ':' "
            "(percent-encode it)"
        ) from None
    for _, port in items:
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(
                "a port in the PostgreSQL store URL is not a number from 1 to 65535"
            )


def _wrong_server(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.PostgresError) and str(exc.sqlstate or "").startswith(
        _WRONG_SERVER
    )


# A query parameter of the URL that asyncpg does not take is sent to the server as a setting:
# one it does not know (undefined_object) or whose value it refuses (invalid_parameter_value)
# ends the connection before it begins.
_BAD_SETTING = ("42704", "22023")


async def connect(dsn: str, **options: Any) -> asyncpg.Connection:
    """``asyncpg.connect(dsn, **options)``, trying each host of a multi-host URL on its own when
    one answers as the wrong server (see the module docstring)."""
    try:
        return await asyncpg.connect(dsn, **options)
    except asyncpg.PostgresError as exc:
        if exc.sqlstate in _BAD_SETTING:
            raise StoreMisconfigured(
                "PostgreSQL refused a setting the store URL passes (a query parameter that is "
                "not a connection option is sent as a server setting): fix the store URL "
                f"({type(exc).__name__}, SQLSTATE {exc.sqlstate})"
            ) from exc
        hosts = hosts_of(dsn)
        if not _wrong_server(exc) or len(hosts) < 2:
            raise
        first = exc
    failures: list[BaseException] = []
    for host, port in hosts:
        try:
            return await asyncpg.connect(dsn, **{**options, "host": host, "port": port})
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            failures.append(exc)
        except asyncpg.exceptions.InternalClientError as exc:  # a standby, for read-write
            failures.append(exc)
    if all(_wrong_server(exc) for exc in failures):
        raise first  # every host says so: it is the database's (or the role's) for real
    raise StoreUnavailable(
        f"PostgreSQL unavailable: one host of the store URL answered SQLSTATE {first.sqlstate} "
        "(another server on its address, as after a failover?) and no other serves the "
        "database for now"
    ) from first
