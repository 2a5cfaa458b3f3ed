"""The fenced code blocks of the docs pages, as the docs tests read them.

A ```` ```python ```` block runs unless the line before it is ``<!-- excerpt -->``; a block with
``title="name.py"`` (or any other titled block) is a file the page asks the reader to write, so
it is written to the working directory instead of run."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.servers import ROOT

DOCS = ROOT / "docs"
EXCERPT = "<!-- excerpt -->"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<lang>[\w+-]*)(?P<info>[^\n`]*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based, the opening fence's
    lang: str
    title: str | None
    excerpt: bool
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        ticks, indent = fence["ticks"], fence["indent"]
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end])
        title = _TITLE.search(fence["info"])
        found.append(
            Block(
                page=page,
                line=i + 1,
                lang=fence["lang"],
                title=title["title"] if title else None,
                excerpt=before == EXCERPT,
                text=textwrap.dedent(body) + "\n",
            )
        )
        i = end + 1
    return found


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))
