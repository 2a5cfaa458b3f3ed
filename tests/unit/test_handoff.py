"""Handoff's settings: ``Provider(handoff=)``, the configuration key, and the budget a delivery
runs within before it is handed off (receiver/_webhooks/handoff.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from receiver import ConfigurationError, Provider
from receiver._config.loader import load_config
from receiver._webhooks.handoff import budget
from tests.support import SECRET


def test_handoff_is_a_provider_option_off_by_default() -> None:
    assert Provider("p", [SECRET]).handoff is False
    assert Provider("p", [SECRET], handoff=True).handoff is True
    for bad in (1, "yes", None):
        with pytest.raises(ConfigurationError, match="handoff must be True or False"):
            Provider("p", [SECRET], handoff=bad)  # type: ignore[arg-type]


def test_the_configuration_file_sets_it(tmp_path: Path) -> None:
    path = tmp_path / "receiver.toml"
    path.write_text(
        '[providers.chat]\nscheme = "slack"\nsecrets_env = ["S"]\nhandoff = true\n'
        '[providers.own]\nsecrets_env = ["O"]\n'
    )
    config = load_config(path)
    assert {p.name: p.handoff for p in config.providers} == {"chat": True, "own": False}
    rx = config.receiver(environ={"S": "8f742231b10e8888abcd99yyyzzz85a5", "O": SECRET})
    assert rx.providers["chat"].handoff is True
    assert rx.providers["own"].handoff is False
    path.write_text('[providers.own]\nsecrets_env = ["O"]\nhandoff = "yes"\n')
    with pytest.raises(ConfigurationError, match=r"providers\.own\.handoff: expected true or"):
        load_config(path)


def test_the_budget_keeps_a_margin_for_the_answer() -> None:
    assert budget(3.0, 0.0) == 2.5  # Slack: 0.5 s kept back
    assert budget(10.0, 0.0) == 9.0  # GitHub: a tenth, 1 s
    assert budget(10.0, 2.0) == 7.0  # what the delivery already waited counts
    assert budget(3.0, 4.0) == 0.0  # never negative
