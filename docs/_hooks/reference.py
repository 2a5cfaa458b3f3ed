"""MkDocs hook: the reference pages are written from the code when the site is built, so that
they cannot drift from it.

- ``<!-- receiver-cli -->`` becomes one section per command of the ``receiver`` command, from
  its own argparse parser: its help, its usage and a table of its options (with their
  environment variables and defaults, as ``--help`` prints them).
- ``<!-- api: MODULE -->`` becomes one mkdocstrings entry (``::: MODULE.NAME``) per name of
  that module's ``__all__``, in order, so that a name added to the public API is documented
  from its docstring without editing the page.
- ``<!-- api: MODULE NAME NAME ... -->`` (the names may run over several lines) becomes one
  entry per name given, in that order: a group of names, for a page that documents one task.
  A name that is not in ``MODULE.__all__`` fails the build; the tests check that every name of
  ``__all__`` is in exactly one group."""

from __future__ import annotations

import argparse
import importlib
import os
import re
from typing import Any

MARKER = "<!-- receiver-cli -->"
API = re.compile(r"^<!-- api: ([\w.]+)((?:\s+\w+)*)\s*-->$", re.M)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _option(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest.upper()}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    if action.choices:
        return f"`{names} {{{','.join(map(str, action.choices))}}}`"
    return f"`{names} {action.metavar or action.dest.upper()}`"


def render(parser: argparse.ArgumentParser) -> str:
    """The reference of every command of ``parser``, as Markdown."""
    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # usage lines wrap the same on every machine
    try:
        out = [
            "```text",
            parser.format_usage().strip(),
            "```",
            "",
            "| option | what it does |",
            "| --- | --- |",
        ]
        out += [
            f"| {_option(a)} | {_cell(a.help or '')} |"
            for a in parser._actions
            if not isinstance(a, argparse._SubParsersAction)
        ]
        for name, help, sub in _commands(parser):
            out += ["", f"## receiver {name}", "", _cell(help)[:1].upper() + _cell(help)[1:] + "."]
            out += ["", "```text", sub.format_usage().strip(), "```", ""]
            rows = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
            if rows:
                out += ["| option | what it does |", "| --- | --- |"]
                out += [f"| {_option(a)} | {_cell(a.help or '')} |" for a in rows]
        return "\n".join(out) + "\n"
    finally:
        if width is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = width


def groups(markdown: str) -> list[tuple[str, list[str]]]:
    """The ``(module, names)`` of each ``<!-- api: ... -->`` marker of a page, in order; the
    names of a marker that names none are those of the module's whole ``__all__``."""
    found = []
    for match in API.finditer(markdown):
        public: list[str] = list(importlib.import_module(match[1]).__all__)
        names = match[2].split() or public
        unknown = [name for name in names if name not in public]
        if unknown:
            raise ValueError(f"not in {match[1]}.__all__: {', '.join(unknown)}")
        found.append((match[1], names))
    return found


def api(module: str, names: list[str]) -> str:
    """A mkdocstrings entry per name."""
    return "\n\n".join(f"::: {module}.{name}" for name in names)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    entries = iter(groups(markdown))
    markdown = API.sub(lambda m: api(*next(entries)), markdown)
    if MARKER not in markdown:
        return markdown
    from receiver._cli.main import build_parser

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RECEIVER_")}
    try:  # defaults as documented, not as this machine's environment sets them
        return markdown.replace(MARKER, render(build_parser()))
    finally:
        os.environ.update(saved)
