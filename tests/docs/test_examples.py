"""Every Python example of the docs (and of the README) runs: each page's blocks in order, in
one fresh namespace, as the lines of one file (no ``await`` outside a function), in a temporary
directory, on the default SQLite store. A block that cannot run on its own is marked
``<!-- excerpt -->``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import EXCERPT, ROOT, Block, blocks, pages

RUNNABLE = {
    page: found
    for page in [ROOT / "README.md", *pages()]
    if (found := [b for b in blocks(page) if (b.lang == "python" or b.title) and not b.excerpt])
    and any(b.lang == "python" and not b.title for b in found)  # something to run
}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_page(page_blocks: list[Block]) -> dict[str, Any]:
    """The page's blocks in order, in one namespace, as the reader runs them: each compiles as
    part of a file (no ``await`` outside a function: a block that awaits says
    ``asyncio.run(main())``, so it runs saved as a file too)."""
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for block in page_blocks:
        if block.title:
            write(Path(block.title), block.text)
            continue
        exec(compile(block.text, block.where(), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("page", list(RUNNABLE), ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("RECEIVER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    try:
        run_page(RUNNABLE[page])
    finally:  # modules the page wrote and imported belong to its directory only
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
                del sys.modules[name]


def test_every_excerpt_mark_is_on_a_python_block() -> None:
    marked = sum(page.read_text().count(EXCERPT) for page in pages())
    on_blocks = sum(1 for page in pages() for b in blocks(page) if b.excerpt)
    assert marked == on_blocks
    assert all(b.lang == "python" for page in pages() for b in blocks(page) if b.excerpt)


def test_every_example_compiles_as_a_file() -> None:
    """A block saved as a file runs: no ``await`` or ``async with`` outside a function."""
    refused = []
    for page in [*RUNNABLE, ROOT / "skills" / "receiver" / "SKILL.md"]:
        for block in blocks(page):
            if block.lang == "python" and not block.excerpt and not block.title:
                try:
                    compile(block.text, block.where(), "exec")
                except SyntaxError as exc:
                    refused.append(f"{block.where()}: {exc.msg}")
    assert refused == []
