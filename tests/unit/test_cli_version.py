"""``receiver --version`` prints the package's version (the one the wheel is built with)."""

from __future__ import annotations

import tomllib

import pytest

import receiver
from receiver._cli.main import main
from tests.servers import ROOT


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"receiver {receiver.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "receiver.__version__"}
