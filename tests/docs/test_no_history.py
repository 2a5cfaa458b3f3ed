"""The docs describe the product as it is: no page tells the history of its own development
(dated runs, issue numbers, "this session", before/after of its own changes). That history
belongs in the commits and CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, pages

HISTORY = [
    re.compile(r"\bissues? #?\d+", re.I),  # an issue of this project
    re.compile(r"\(#\d+\)"),
    re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),  # a dated run
    re.compile(r"\b(this|last|previous|earlier) session\b", re.I),
    re.compile(r"\bbefore this (change|session|release)\b", re.I),
]


def prose(text: str) -> str:
    """The page without its code (fenced and inline) and without links to other projects,
    whose issue numbers and dates are theirs."""
    text = re.sub(r"^(\s*)(`{3,}).*?^\1\2", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\[[^\]]*\]\(https?://[^)]*\)", "", text)


@pytest.mark.parametrize("page", [ROOT / "README.md", *pages()], ids=lambda p: p.name)
def test_no_page_tells_its_own_history(page: Path) -> None:
    text = prose(page.read_text())
    found = [m.group(0) for pattern in HISTORY for m in pattern.finditer(text)]
    assert found == [], f"{page.relative_to(ROOT)}: {found}"
