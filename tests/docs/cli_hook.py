"""Loads the docs build's hook (docs/_hooks/reference.py) so that tests can use it."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.servers import ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_docs_reference_hook", ROOT / "docs/_hooks/reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hook = _load()


def commands(parser: object) -> list[str]:
    return [name for name, _, _ in hook._commands(parser)]
