"""The public API does not change without a changelog entry: every name of
``receiver.__all__``, every command of ``receiver`` and every migration is mentioned in
CHANGELOG.md, which keeps the Keep a Changelog shape (an Unreleased section on top)."""

from __future__ import annotations

import re

import receiver
from receiver._cli.main import build_parser
from receiver._store.migrations import migrations
from tests.docs.cli_hook import commands
from tests.servers import ROOT

CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
QUOTED = set(re.findall(r"`([^`]+)`", CHANGELOG))
# A name counts quoted alone or with its module (`receiver.IdempotencyProxy`).
MENTIONED = QUOTED | {q.removeprefix("receiver.") for q in QUOTED}


def test_unreleased_is_on_top_and_releases_are_versions() -> None:
    sections = re.findall(r"^## \[([^\]]+)\]", CHANGELOG, re.M)
    assert sections[0] == "Unreleased"
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", s) for s in sections[1:]), sections
    assert receiver.__version__ in sections


def test_every_public_name_is_in_the_changelog() -> None:
    missing = [name for name in receiver.__all__ if name not in MENTIONED]
    assert missing == [], f"add these to CHANGELOG.md (## [Unreleased]): {missing}"


def test_every_command_is_in_the_changelog() -> None:
    said = {" ".join(q.split()[:2]) for q in QUOTED}  # `receiver init [DIR]` names init
    missing = [n for n in commands(build_parser()) if f"receiver {n}" not in said]
    assert missing == [], f"add these to CHANGELOG.md (## [Unreleased]): {missing}"


def test_every_migration_is_in_the_changelog() -> None:
    for dialect in ("postgresql", "sqlite"):
        names = [m.label for m in migrations(dialect)]
        missing = [n for n in names if n not in MENTIONED]
        assert missing == [], f"add these to CHANGELOG.md (## [Unreleased]): {missing}"
