"""HTML for the console's pages: the templates shipped beside this module, and small builders
that escape every value they are given.

The templates are ``string.Template`` files (``$name`` placeholders), loaded once through
importlib.resources so that they travel inside the wheel. A placeholder receives HTML that a
builder here made: a value from the ledger (a webhook-id, an error, a payload) only ever
reaches a page through :func:`esc`.
"""

from __future__ import annotations

import datetime
import functools
import html
import importlib.resources
import string
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence

#: Already-escaped HTML, as the builders return it.
Html = str


def esc(value: object) -> Html:
    return html.escape("" if value is None else str(value), quote=True)


@functools.cache
def _template(name: str) -> string.Template:
    text = importlib.resources.files("receiver._console").joinpath(name).read_text("utf-8")
    return string.Template(text)


def render(name: str, **parts: Html) -> Html:
    """Fill template ``name`` with HTML parts (every placeholder must be given)."""
    return _template(name).substitute(parts)


@functools.cache
def static(name: str) -> bytes:
    return importlib.resources.files("receiver._console").joinpath(name).read_bytes()


def url(root: str, path: str, params: Mapping[str, object] | None = None) -> str:
    """A console URL under the mount point; empty and None parameters are left out."""
    query = urllib.parse.urlencode(
        {k: str(v) for k, v in (params or {}).items() if v not in (None, "")}
    )
    return f"{root}{path}" + (f"?{query}" if query else "")


def link(href: str, text: object, cls: str = "") -> Html:
    attribute = f' class="{esc(cls)}"' if cls else ""
    return f'<a href="{esc(href)}"{attribute}>{esc(text)}</a>'


def table(
    headers: Sequence[str], rows: Iterable[Sequence[Html]], cls: str = "", empty: str = "none"
) -> Html:
    """Cells are HTML already (escape values with :func:`esc`)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{esc(empty)}</td></tr>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    attribute = f' class="{esc(cls)}"' if cls else ""
    return f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def fields(pairs: Iterable[tuple[str, Html]]) -> Html:
    """A definition list; values are HTML already."""
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def when(seconds: float | None) -> Html:
    """UTC time to the second, as a <time> element; '-' for none, 'never' for infinity."""
    if seconds is None:
        return "-"
    if seconds >= 1e12 or seconds != seconds:
        return "never"
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return (
        f'<time datetime="{moment.isoformat()}">{esc(moment.strftime("%Y-%m-%d %H:%M:%S"))}Z</time>'
    )


def duration(seconds: float) -> str:
    """'3 s', '4 min', '2 h 5 min', '3 d 4 h'."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def badge(text: str, cls: str) -> Html:
    return f'<span class="badge {esc(cls)}">{esc(text)}</span>'


def hidden(name: str, value: object) -> Html:
    return f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'


def form(
    action: str,
    csrf: str,
    inner: Html,
    button: str,
    cls: str = "",
    values: Mapping[str, object] | None = None,
) -> Html:
    """A POST form carrying the CSRF token and ``values`` as hidden fields."""
    fields = (values or {}).items()
    hiddens = hidden("csrf", csrf) + "".join(hidden(k, v) for k, v in fields)
    attribute = f' class="{esc(cls)}"' if cls else ""
    return (
        f'<form method="post" action="{esc(action)}"{attribute}>{hiddens}{inner}'
        f'<button type="submit">{esc(button)}</button></form>'
    )
