"""An app's own migrations (``migrations = "sql"`` in receiver.toml, applied by ``receiver
migrate`` and by ``Config.migrate``) on both stores: in name order, each file once, recorded
with its checksum; a file changed after it was applied is refused and changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from receiver import ConfigurationError, Store, load_config, store_from_url

PROVIDER = '[providers.shop]\nscheme = "standard-webhooks"\nsecrets_env = ["SHOP_SECRET"]\n'


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "sql").mkdir()
    for name, text in files.items():
        (tmp_path / "sql" / name).write_text(text)
    config = tmp_path / "receiver.toml"
    config.write_text('migrations = "sql"\n' + PROVIDER)
    return config


async def test_the_files_run_in_name_order_each_once(store: Store, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    # The second file needs the first's table: name order, not the order they were written in.
    config = project(
        tmp_path,
        {
            f"0002_{tag}.sql": f"INSERT INTO t_{tag} (id) VALUES ('a');\n"
            f"INSERT INTO t_{tag} (id) VALUES ('b');\n",
            f"0001_{tag}.sql": f"-- the table\nCREATE TABLE t_{tag} (id TEXT NOT NULL);\n",
        },
    )
    loaded = load_config(config)
    try:
        assert await loaded.migrate(store) == [f"0001_{tag}.sql", f"0002_{tag}.sql"]
        assert await loaded.migrate(store) == []
        async with store.acquire() as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM t_{tag}") == 2
        (tmp_path / "sql" / f"0003_{tag}.sql").write_text(f"INSERT INTO t_{tag} (id) VALUES ('c');")
        assert await loaded.migrate(store) == [f"0003_{tag}.sql"]

        (tmp_path / "sql" / f"0002_{tag}.sql").write_text(f"INSERT INTO t_{tag} (id) VALUES ('x');")
        with pytest.raises(ConfigurationError, match=f"0002_{tag}.sql changed after it was"):
            await loaded.migrate(store)
        async with store.acquire() as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM t_{tag}") == 3
    finally:
        async with store.acquire() as conn:
            await conn.execute(f"DROP TABLE IF EXISTS t_{tag}")


async def test_a_failing_file_leaves_nothing_and_is_not_recorded(
    store: Store, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    config = project(
        tmp_path,
        {
            f"0001_{tag}.sql": f"CREATE TABLE t_{tag} (id TEXT);\n"
            f"INSERT INTO nowhere_{tag} VALUES (1);"
        },
    )
    loaded = load_config(config)
    with pytest.raises(Exception, match=f"nowhere_{tag}"):  # the driver's own error
        await loaded.migrate(store)
    (tmp_path / "sql" / f"0001_{tag}.sql").write_text(f"CREATE TABLE t_{tag} (id TEXT);")
    try:
        assert await loaded.migrate(store) == [f"0001_{tag}.sql"]  # the table was rolled back
    finally:
        async with store.acquire() as conn:
            await conn.execute(f"DROP TABLE IF EXISTS t_{tag}")


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    config = tmp_path / "receiver.toml"
    config.write_text('migrations = "nope"\n' + PROVIDER)
    with pytest.raises(ConfigurationError, match="is not a directory"):
        asyncio.run(load_config(config).migrate(store_from_url(f"sqlite:///{tmp_path}/a.db")))


def test_the_key_is_a_directory_name(tmp_path: Path) -> None:
    config = tmp_path / "receiver.toml"
    config.write_text("migrations = 3\n" + PROVIDER)
    with pytest.raises(ConfigurationError, match=r"expected a directory of \.sql files"):
        load_config(config)
