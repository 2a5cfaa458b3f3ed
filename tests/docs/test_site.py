"""The documentation site as it is built: every page loads only what the site itself serves
(no web fonts, scripts or stylesheets from a third party), and long code lines wrap."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT

# What a browser fetches by itself as a page loads: a script, an image or a frame, and a
# stylesheet, font or connection a <link> asks for. A link to another site, which the reader
# may follow, is not one, nor a <link rel="canonical"> naming a page.
_SOURCE = re.compile(r"<(?:script|img|iframe|source)\b[^>]*\bsrc=\"([^\"]+)\"")
_LINK = re.compile(r"<link\b([^>]*)>")
_FETCHING_RELS = re.compile(r"\brel=\"[^\"]*\b(stylesheet|preconnect|preload|icon|modulepreload)\b")
_HREF = re.compile(r"\bhref=\"([^\"]+)\"")
_ELSEWHERE = re.compile(r"(https?:)?//")


def _fetched(html: str) -> list[str]:
    urls = _SOURCE.findall(html)
    for attributes in _LINK.findall(html):
        href = _HREF.search(attributes)
        if href and _FETCHING_RELS.search(attributes):
            urls.append(href.group(1))
    return urls


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=300,
    )
    return out


def test_no_page_loads_anything_from_another_site(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 30
    external = sorted(
        f"{page.relative_to(site)}: {url}"
        for page in pages
        for url in _fetched(page.read_text())
        if _ELSEWHERE.match(url)
    )
    assert not external, external[:10]


def test_long_code_lines_wrap(site: Path) -> None:
    index = (site / "index.html").read_text()
    assert "stylesheets/code.css" in index
    assert "pre-wrap" in (site / "stylesheets" / "code.css").read_text()


def test_the_examples_a_page_names_are_on_it_whole(site: Path) -> None:
    """The mounting guide shows the example files the suite runs (snippets of the
    repository), not a path into a repository the reader may not have."""
    page = html.unescape(
        re.sub(r"<[^>]+>", "", (site / "how-to" / "mounting" / "index.html").read_text())
    )
    for name in ("mounted.py", "fastapi_app.py", "standalone.py"):
        for line in (ROOT / "examples" / name).read_text().splitlines():
            assert line.strip() in page, f"{name}: {line}"
    assert "--8<--" not in page
