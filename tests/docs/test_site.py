"""The documentation site as it is built: every page loads only what the site itself serves
(no web fonts, scripts or stylesheets from a third party), long code lines wrap, and the API
reference shows every public signature with its parameters, in Markdown."""

from __future__ import annotations

import html
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import receiver.testing as testing
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


def _api_pages() -> dict[str, tuple[str, str]]:
    """Each public name of ``receiver`` and ``receiver.testing``: its page's path in the built
    site and the module it is documented under."""
    from tests.docs.cli_hook import hook

    pages = {}
    for source in sorted((ROOT / "docs" / "reference" / "api").glob("*.md")):
        built = "reference/api/" + ("" if source.stem == "index" else f"{source.stem}/")
        for module, names in hook.groups(source.read_text()):
            pages.update({name: (built + "index.html", module) for name in names})
    pages.update(
        {name: ("reference/testing/index.html", "receiver.testing") for name in testing.__all__}
    )
    return pages


def _parameters(obj: object) -> list[str]:
    """The public parameters of a public function, or of a class's own ``__init__``
    (an exception's, an enum's or a protocol's come from the standard library)."""
    if isinstance(obj, type):
        init = next(c.__dict__["__init__"] for c in obj.__mro__ if "__init__" in c.__dict__)
        if not getattr(init, "__module__", "").startswith("receiver"):
            return []
    elif not inspect.isfunction(obj):
        return []
    return [
        name
        for name in inspect.signature(obj).parameters
        if not name.startswith("_") and name != "self"
    ]


def test_every_public_signature_is_on_the_reference_with_its_parameters(site: Path) -> None:
    """A class's entry shows how to build it (its ``__init__``'s parameters merged into it),
    a function's how to call it, each parameter named in the rendered signature."""
    missing = []
    for name, (page, module) in _api_pages().items():
        text = (site / page).read_text()
        anchor = f'id="{module}.{name}"'
        assert anchor in text, f"{name} is not on {page}"
        after = text.split(anchor, 1)[1]
        section = re.split(rf'id="{re.escape(module)}\.\w+"', after, maxsplit=1)[0]
        obj = getattr(importlib.import_module(module), name)
        parameters = _parameters(obj)
        if not parameters:
            continue
        signature = re.search(r'<div class="doc-signature[^"]*">(.*?)</div>', section, re.S)
        assert signature, f"{name} has no signature on {page}"
        shown = html.unescape(re.sub(r"<[^>]+>", "", signature.group(1)))
        missing += [
            f"{name}({parameter})"
            for parameter in parameters
            if not re.search(rf"(?<![\w.])\**{parameter}\b\s*[:=,)\n]", shown)
        ]
    assert not missing, missing


def test_the_api_pages_show_no_restructuredtext(site: Path) -> None:
    """Docstrings are Markdown: no Sphinx role (``:meth:`x```) or ``::`` literal block shows
    through, and no private base class is named."""
    pages = sorted({page for page, _ in _api_pages().values()})
    pages += ["reference/contrib/index.html"]
    leftovers = []
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", (site / page).read_text()))
        for line in text.splitlines():
            if re.search(r":(meth|class|func|attr|exc|data|mod|obj):|(?<!:)::\s*$|Bases:", line):
                leftovers.append(f"{page}: {line.strip()}")
    assert not leftovers, leftovers
