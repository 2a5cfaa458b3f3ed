"""Every Python example of the docs (and of the README) runs: each page's blocks in order, in
one fresh namespace and one event loop (a block may ``await`` at its top level), in a temporary
directory, on the default SQLite store. A block that cannot run on its own is marked
``<!-- excerpt -->``."""

from __future__ import annotations

import ast
import asyncio
import inspect
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
    namespace: dict[str, Any] = {"__name__": "__docs__"}

    async def play() -> None:
        for block in page_blocks:
            if block.title:
                write(Path(block.title), block.text)
                continue
            code = compile(block.text, block.where(), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(code, namespace)
            if code.co_flags & inspect.CO_COROUTINE:
                await result

    asyncio.run(play())
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
