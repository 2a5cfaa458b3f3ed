"""The package's import graph: no cycles between modules, and the layers of the tree.

Every import counts: at module level, inside functions, and under ``TYPE_CHECKING`` (a cycle
there is still two modules that cannot be understood, or split, one without the other).

The layers (CONTRIBUTING.md "Repository layout"): the stores import nothing above them; the ledger
builds on the stores; verification stands alone; operations and the queue build on the
ledger; the three entry points (webhooks, agent actions, the Idempotency-Key middleware)
import those shared layers and never each other; the operator console reads and acts on the
ledger through the shared layers (a Receiver hands it its handlers structurally); configuration
and the CLI sit on top. The
integrations of ``contrib/`` use the public API only, and never one another.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import receiver

PACKAGE = Path(receiver.__file__).parent

ROOTS = {"_exceptions", "_logging", "_secrets", "_values"}  # imported by every layer
SHARED = {"_store", "_ledger", "_verification", "_ops", "_queue"}
ENTRY_POINTS = {"_webhooks", "_actions", "_idempotency", "_proxy"}
#: What each part of the package may import, besides itself and ROOTS.
ALLOWED: dict[str, set[str]] = {
    "_exceptions": set(),
    "_logging": set(),
    "_secrets": set(),
    "_values": set(),
    "_store": set(),
    "_ledger": {"_store"},
    "_verification": set(),
    "_ops": {"_store", "_ledger"},
    "_queue": {"_store", "_ledger", "_ops"},
    "_webhooks": SHARED | {"_console"},
    "_actions": SHARED,
    "_idempotency": SHARED,
    # The proxy is the middleware's semantics in front of an upstream: it reuses its key
    # parsing, fingerprint and answers.
    "_proxy": SHARED | {"_idempotency"},
    "_config": SHARED | {"_webhooks"},
    "_console": SHARED,
    "_cli": SHARED | ENTRY_POINTS | {"_config", "_console"},
    "testing": SHARED | ENTRY_POINTS | {"__init__"},
    "__init__": SHARED | ENTRY_POINTS | {"_config", "_console"},
    "contrib": {"__init__"},
}


def module_name(path: Path) -> str:
    """``_ledger.receipts`` for receiver/_ledger/receipts.py, ``_cli`` for its __init__.py."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for p in PACKAGE.rglob("*.py")
        if "sql" not in p.relative_to(PACKAGE).parts
    }


def imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports, by module name."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    package = parts[:-1]  # the package a relative import starts from
    found: set[str] = set()

    def add(dotted: list[str]) -> None:
        # The longest prefix that is a module of ours: "from .x import name" names x.
        for end in range(len(dotted), 0, -1):
            candidate = ".".join(dotted[:end])
            if candidate in known:
                found.add(candidate)
                return
        if not dotted:
            found.add("__init__")

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
            elif (node.module or "").startswith("receiver"):
                base = []
            else:
                continue
            module = (node.module or "").split(".") if node.module else []
            if not node.level:
                module = module[1:]  # drop "receiver"
            target = base + module
            if node.module is None or not module:
                for alias in node.names:
                    dotted = [*target, alias.name]
                    if ".".join(dotted) in known:
                        found.add(".".join(dotted))
                    else:
                        add(target)
            else:
                add(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("receiver."):
                    add(alias.name.split(".")[1:])
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) - {name} for name, path in found.items()}


def part(module: str) -> str:
    return module.split(".")[0]


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


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "_ledger.receipts" in edges["_webhooks.pipeline"]
    assert "_exceptions" in edges["_store.postgres"]
    assert "_ledger.receipts" in edges["_ledger.keyed"]  # "from . import receipts as ledger"


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_every_part_of_the_package_has_its_layer() -> None:
    assert {part(m) for m in modules()} == set(ALLOWED)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if part(target) != part(module)
        and part(target) not in ROOTS
        and part(target) not in ALLOWED[part(module)]
    )
    assert wrong == []


def test_no_integration_imports_another() -> None:
    edges = graph()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        if module.startswith("contrib.")
        for target in targets
        if target.startswith("contrib.")
    )
    assert wrong == []


def test_the_core_imports_no_framework_it_integrates() -> None:
    """``import receiver`` must work without any extra installed: it loads none of them."""
    frameworks = ["mcp", "agents", "langgraph", "pydantic_ai", "playwright", "dbos", "prefect"]
    code = (
        "import sys, receiver, receiver.testing\n"
        f"print(sorted(m for m in {frameworks!r} if m in sys.modules))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"
