"""No import cycles between the package's modules, counting every import: at module level,
inside functions, and under ``TYPE_CHECKING`` (a cycle there is still two modules that cannot be
understood, or split, one without the other)."""

from __future__ import annotations

import ast
from pathlib import Path

import receiver

PACKAGE = Path(receiver.__file__).parent


def imports(path: Path) -> set[str]:
    """The package modules that ``path`` imports, by module name (``_ledger``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module is None:  # from . import _ledger
                found.update(alias.name for alias in node.names)
            elif node.level == 1 and node.module:  # from ._ledger import Key
                found.add(node.module.split(".")[0])
            elif node.level == 0 and (node.module or "").startswith("receiver."):
                found.add((node.module or "").split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("receiver."):
                    found.add(alias.name.split(".")[1])
    return found


def graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {name: imports(path) & set(modules) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One path around each cycle found by a depth-first search."""
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    edges = graph()
    assert "_ledger" in edges["_pipeline"]  # the graph is read at all
    assert cycles(edges) == []
