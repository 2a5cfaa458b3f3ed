"""What README.md shows must be what the code does: the configuration file example, with the
typo the README makes in it, gives the error the README quotes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from receiver import ConfigurationError, load_config
from tests.servers import ROOT

README = (ROOT / "README.md").read_text()


def test_the_quoted_typo_error_is_the_real_one(tmp_path: Path) -> None:
    example = re.search(r"```toml\n(.*?)```", README, re.S)
    assert example, "README has no TOML example"
    quoted = re.search(r"\$ receiver serve --config receiver\.toml\n\s*(receiver: .*)\n", README)
    assert quoted, "README quotes no error for the example"
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

    assert "receipts.db" not in README
    assert DEFAULT_STORE in README
