"""Where things are in a TOML configuration file, for error messages that point at them.

tomllib reports where a syntax error is (:func:`syntax_error`); for everything else the line
comes from a plain scan of the source for each key (:func:`scan`), and :func:`located` names the
file, the line and the key path: ``receiver.toml:12: providers.billing.schedule: ...``.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from .._exceptions import ConfigurationError

#: A key path: table and key names, and indexes into arrays.
Key = tuple[str | int, ...]


def located(
    path: str, lines: Mapping[tuple[str, ...], int], key: Key, message: str
) -> ConfigurationError:
    """``receiver.toml:12: providers.billing.ttl: message``; the line of the key itself, else
    of the closest enclosing table or key found in the source."""
    names = tuple(part for part in key if isinstance(part, str))
    while names and names not in lines:
        names = names[:-1]
    where = f"{path}:{lines[names]}" if names else path
    dotted = "".join(
        f"[{part}]"
        if isinstance(part, int)
        else ("." if i else "")
        + (part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else json.dumps(part))
        for i, part in enumerate(key)
    )
    return ConfigurationError(f"{where}: {dotted}: {message}" if dotted else f"{where}: {message}")


def read(name: str) -> tuple[str, dict[str, Any]]:
    """The text of the TOML file ``name`` and its document; ConfigurationError naming the file
    (and the line, where there is one) when it cannot be read or parsed."""
    try:
        with open(name, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {name}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a NUL in the path: no file can have that name
        shown = name.replace("\x00", "\\x00")  # spelled out: a NUL would end the line
        raise ConfigurationError(
            f"cannot read {shown}: a path cannot hold a NUL character"
        ) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigurationError(f"{name}:{line}: not UTF-8 text; TOML files are UTF-8") from exc
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(syntax_error(name, exc)) from exc
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigurationError(
            f"{name}: invalid TOML: arrays or inline tables nested too deeply"
        ) from None


_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def syntax_error(path: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    found = _AT.search(message)
    if found is None:
        return f"{path}: invalid TOML: {message}"
    reason = message[: found.start()]
    if found.group(1) is None:
        return f"{path}: invalid TOML at the end of the file: {reason}"
    return f"{path}:{found.group(1)}:{found.group(2)}: invalid TOML: {reason}"


_PART = r'[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\''
_DOTTED = rf"(?:{_PART})(?:\s*\.\s*(?:{_PART}))*"
_TABLE_LINE = re.compile(rf"\s*\[\[?\s*({_DOTTED})\s*\]")
_KEY_LINE = re.compile(rf"\s*({_DOTTED})\s*=")


def _parts(dotted: str) -> tuple[str, ...]:
    parts: list[str] = []
    for match in re.finditer(_PART, dotted):
        part = match.group()
        if part.startswith('"'):
            try:
                part = json.loads(part)  # TOML basic strings escape like JSON, \U aside
            except ValueError:
                part = part[1:-1]
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def scan(text: str) -> dict[tuple[str, ...], int]:
    """The first line of every table header and key in ``text`` (and of their prefixes).

    Not a TOML parser: the text already parsed, this only says where things are. It skips
    the insides of multi-line strings and arrays; keys inside inline tables resolve to the line
    of the table's own key, which is close enough for an error message.
    """
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    inside: str | None = None  # the closing delimiter of the multi-line string we are in
    depth = 0  # how many arrays are open at the end of the line
    for number, line in enumerate(text.split("\n"), 1):
        if inside is not None:
            if line.count(inside) % 2:
                inside = None
            continue
        if depth > 0:
            depth += _brackets(line)
            continue
        if header := _TABLE_LINE.match(line):
            table = _parts(header.group(1))
            names = table
        elif assignment := _KEY_LINE.match(line):
            names = table + _parts(assignment.group(1))
            rest = line[assignment.end() :]
            inside = next((d for d in ('"""', "'''") if rest.count(d) % 2), None)
            depth = 0 if inside else _brackets(rest)
        else:
            continue
        for end in range(1, len(names) + 1):
            found.setdefault(names[:end], number)
    return found


_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'")


def _brackets(text: str) -> int:
    """Arrays opened minus arrays closed in ``text``, outside strings and comments."""
    code = _STRING.sub("", text).split("#", 1)[0]
    return code.count("[") - code.count("]")


def show(value: object) -> str:
    """A value as TOML spells it, with its TOML type."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{json.dumps(value)} (a string)"
    if isinstance(value, int | float):
        return f"{value!r} ({'a float' if isinstance(value, float) else 'an integer'})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"{value} (a {type(value).__name__})"  # dates and times
