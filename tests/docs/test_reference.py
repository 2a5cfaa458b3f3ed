"""The reference pages cover what they claim: the CLI page is generated from the parser (every
command and option, whatever the environment says), the API pages list every public name, each
in exactly one group, and the README is a short front page whose links resolve and reach every
section of the docs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from types import ModuleType

import pytest

import receiver
import receiver.testing
from receiver._cli.main import build_parser
from tests.docs.cli_hook import commands, hook
from tests.servers import ROOT

DOCS = ROOT / "docs"


def test_the_cli_page_is_generated_from_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    assert hook.MARKER in page
    monkeypatch.setenv("RECEIVER_PORT", "9999")  # the page shows defaults, not this machine's
    rendered = hook.on_page_markdown(page)
    assert hook.MARKER not in rendered
    assert "default 9999" not in rendered
    assert "default 8000" in rendered
    parser = build_parser()
    assert len(commands(parser)) >= 10
    for name, _, sub in hook._commands(parser):
        assert f"\n## receiver {name}\n" in rendered
        section = rendered.split(f"\n## receiver {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in section or f", {option}" in section, (name, option)
    assert "--version" in rendered


def api_groups() -> dict[str, list[tuple[str, list[str]]]]:
    """The groups of names each page of the Python API lists, by page."""
    return {
        page.name: hook.groups(page.read_text())
        for page in sorted((DOCS / "reference" / "api").glob("*.md"))
    }


def test_every_public_name_is_in_exactly_one_group_of_the_api_pages() -> None:
    listed = [
        name for groups in api_groups().values() for module, names in groups for name in names
    ]
    assert {module for groups in api_groups().values() for module, _ in groups} == {"receiver"}
    assert sorted(listed) == sorted(receiver.__all__)  # each once: no name left out or repeated
    assert len(api_groups()) >= 8  # one page per task, not one page of everything


def test_a_group_naming_what_is_not_public_fails_the_build() -> None:
    with pytest.raises(ValueError, match="Serving"):
        hook.on_page_markdown("<!-- api: receiver Receiver\n  Serving -->")


@pytest.mark.parametrize("page", ["webhooks.md", "errors.md"])
def test_a_group_becomes_one_entry_per_name_in_its_order(page: str) -> None:
    text = (DOCS / "reference" / "api" / page).read_text()
    rendered = hook.on_page_markdown(text)
    assert "<!-- api:" not in rendered
    found = re.findall(r"^::: receiver\.(\w+)$", rendered, re.M)
    assert found == [name for _, names in api_groups()[page] for name in names]


def test_the_testing_page_documents_every_public_name() -> None:
    module: ModuleType = receiver.testing
    text = (DOCS / "reference" / "testing.md").read_text()
    assert f"<!-- api: {module.__name__} -->" in text
    rendered = hook.on_page_markdown(text)
    found = re.findall(rf"^::: {re.escape(module.__name__)}\.(\w+)$", rendered, re.M)
    assert found == list(module.__all__)


def test_the_readme_is_a_short_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert [link for link in local if not (ROOT / link).exists()] == []
    for section in (
        "docs/tutorial.md",
        "docs/how-to/",
        "docs/reference/",
        "docs/explanation/",
        "docs/performance/",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "LICENSE",
    ):
        assert any(link.startswith(section) for link in local), section


def test_every_metric_is_in_the_metrics_reference() -> None:
    from prometheus_client import CollectorRegistry

    page = (DOCS / "reference" / "metrics.md").read_text()
    registry = CollectorRegistry()
    receiver.ActionMetrics(registry)
    families = [*receiver.Metrics().registry.collect(), *registry.collect()]
    names = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    assert len(names) > 15
    assert sorted(n for n in names if f"`{n}`" not in page) == []


def test_every_alert_line_is_in_the_log_reference() -> None:
    """Each ``ALERT:`` message the package logs is listed, up to its first variable part."""
    import ast

    page = (DOCS / "reference" / "metrics.md").read_text()
    prefixes = set()
    for path in (ROOT / "receiver").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                text = first.value
                if text.startswith("ALERT: "):
                    prefixes.add(re.split(r"%|\{", text, maxsplit=1)[0].rstrip(" ("))
    assert len(prefixes) > 10
    assert sorted(p for p in prefixes if p not in page) == []


def test_every_extra_the_docs_name_exists() -> None:
    """An install line names only extras the package declares (pip warns and installs
    without an unknown one), in the docs, the README, the skill and the files init writes."""
    import tomllib

    from receiver._cli import scaffold

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(project["optional-dependencies"])
    pages = [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "skills").rglob("*.md")]
    texts = [page.read_text() for page in pages]
    texts.append(Path(scaffold.__file__).read_text())
    named = {
        extra.strip()
        for text in texts
        for group in re.findall(r"receiver-webhooks\[([^\]]+)\]", text)
        for extra in group.split(",")
    }
    assert named
    assert sorted(named - declared) == []
