"""An application's own migrations: the ``.sql`` files of one directory (``migrations = "sql"``
in receiver.toml), applied by ``receiver migrate`` after the ledger's, in name order, each once.

They create the app's tables as the role that runs ``receiver migrate`` (the owner), so the
role that serves needs no CREATE on the schema. A database records each file it has, with its
checksum, in ``receiver_app_migrations``; a file changed after it was applied is refused (add a
new file instead). The run holds the ledger runner's lock (PostgreSQL's advisory lock, SQLite's
``BEGIN IMMEDIATE``), and each file commits in one transaction with its record.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .._exceptions import ConfigurationError
from .migrations import Store, _exclusive
from .queries import runner_queries, split_statements


def app_files(directory: Path) -> list[Path]:
    """The directory's ``.sql`` files, in name order (``0001_orders.sql``, ``0002_...``)."""
    if not directory.is_dir():
        raise ConfigurationError(
            f"migrations: {directory} is not a directory (of the app's .sql files)"
        )
    return sorted(path for path in directory.iterdir() if path.suffix == ".sql")


async def apply_app(store: Store, directory: Path) -> list[str]:
    """Apply the files of ``directory`` the store lacks; the names of those applied."""
    files = [(path.name, path.read_text(encoding="utf-8")) for path in app_files(directory)]
    done: list[str] = []
    async with store.acquire() as conn:
        sql = runner_queries(conn.dialect)
        async with _exclusive(conn):
            await conn.execute(sql["app_create_table"])
            applied = {row["name"]: row["checksum"] for row in await conn.fetch(sql["app_applied"])}
            for name, text in files:
                checksum = hashlib.sha256(text.encode()).hexdigest()
                if name in applied:
                    if applied[name] != checksum:
                        raise ConfigurationError(
                            f"migrations: {name} changed after it was applied to {store.url}: "
                            "leave applied files as they are and add a new file"
                        )
                    continue
                async with conn.transaction():
                    for statement in split_statements(text):
                        await conn.execute(statement)
                    await conn.execute(sql["app_record"], name, checksum)
                done.append(name)
    return done
