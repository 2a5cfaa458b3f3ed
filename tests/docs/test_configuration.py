"""The configuration reference (docs/reference/configuration.md) is what the loader does: its
example, with the typo the page makes in it, gives the error the page quotes; every key the
loader accepts is in its tables, and nothing else is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from receiver import ConfigurationError, load_config
from receiver._config import loader
from tests.servers import ROOT

PAGE = (ROOT / "docs" / "reference" / "configuration.md").read_text()


def test_the_quoted_typo_error_is_the_real_one(tmp_path: Path) -> None:
    example = re.search(r"```toml[^\n]*\n(.*?)```", PAGE, re.S)
    assert example, "the page has no TOML example"
    quoted = re.search(r"\$ receiver serve --config receiver\.toml\n\s*(receiver: .*)\n", PAGE)
    assert quoted, "the page quotes no error for the example"
    typo = re.search(r"providers\.(\w+)\.(\w+): unknown key \(did you mean (\w+)\?\)", quoted[1])
    assert typo, quoted[1]
    wrong, right = typo[2], typo[3]
    path = tmp_path / "receiver.toml"
    path.write_text(example[1].replace(f"\n{right} =", f"\n{wrong} =", 1))
    with pytest.raises(ConfigurationError) as raised:
        load_config(path)
    assert f"receiver: {raised.value}".replace(str(tmp_path) + "/", "") == quoted[1]


def test_the_default_store_is_named_as_it_is() -> None:
    from receiver._webhooks.app import DEFAULT_STORE

    assert "receipts.db" not in PAGE
    assert DEFAULT_STORE in PAGE


def _table_keys(heading: str) -> list[str]:
    section = PAGE.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", section, re.M)


def test_every_key_is_in_the_tables() -> None:
    assert sorted(_table_keys("## Top-level keys")) == sorted(loader._TOP_KEYS)
    assert sorted(_table_keys("## Provider keys")) == sorted(loader._PROVIDER_KEYS)
