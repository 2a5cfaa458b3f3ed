"""The Python's mutants: mutmut writes them (``[tool.mutmut]`` in pyproject.toml) into
mutants/, as functions its trampolines switch to by name; :mod:`tests.mutation.plugin` runs
them. Also the equivalent ones, and the table per module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .sql import ROOT

PY_EQUIVALENT: dict[str, str] = {
    "receiver._ledger.receipts.x_encode_headers__mutmut_2": (
        "no headers stored as [] instead of NULL: the column is only read through "
        "decode_headers(), which gives () for both"
    ),
    "receiver._webhooks.recovery.x\u01c1Recovery\u01c1recover__mutmut_1": (
        "recover(reconcile=)'s default: no caller uses it (Pipeline.recover always passes it)"
    ),
    "receiver._ops.sweeper.x_sweep__mutmut_1": (
        "sweep(batch=)'s default: both callers pass it (the Receiver's sweep and "
        "KeySweeper.run_once)"
    ),
    "receiver._ops.sweeper.x_sweep__mutmut_46": (
        "> for >= against the pass's deadline: equal only if time.monotonic() returns the "
        "deadline to the last bit, and then one batch more or less at the instant the budget ends"
    ),
    **dict.fromkeys(
        (f"receiver._ledger.receipts.x_claim_many__mutmut_{n}" for n in (59, 62, 63)),
        "zip(strict=) only guards the statement: claim_many returns one row per input by "
        "construction (FROM input, one row of first per key, ORDER BY i.n)",
    ),
    **dict.fromkeys(
        (f"receiver._ledger.receipts.x_complete_many__mutmut_{n}" for n in (3, 4, 5)),
        "which dialect pipelines and which wraps the batch in a transaction of its own: each "
        "completion is its own fenced UPDATE, so every receipt's outcome and each item's "
        "answer are the same either way; what differs is round trips and COMMITs (the "
        "benchmarks' concern, not a receipt's)",
    ),
}


def python_mutants(prefixes: Sequence[str], root: Path = ROOT) -> list[str]:
    """The names of the mutants mutmut generated (``mutmut run`` writes them to
    mutants/**/*.meta), those starting with one of ``prefixes`` (all if none)."""
    names: list[str] = []
    for meta in sorted((root / "mutants").glob("**/*.py.meta")):
        names += json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    return [n for n in names if not prefixes or any(n.startswith(p) for p in prefixes)]


def generate_python() -> None:
    """mutmut's mutants of ``[tool.mutmut]``'s modules, written into mutants/ (the first
    step of ``mutmut run``; its own runner, a pytest session per mutant, is not used)."""
    from mutmut import __main__ as mutmut
    from mutmut.utils import file_utils

    os.chdir(ROOT)
    mutmut.set_mutant_under_test("mutant_generation")
    (ROOT / "mutants").mkdir(exist_ok=True)
    file_utils.copy_src_dir()
    file_utils.copy_also_copy_files()
    file_utils.setup_source_paths()
    mutmut.store_lines_covered_by_tests()
    mutmut.create_mutants(os.cpu_count() or 1)


def run_python(names: Sequence[str], results: Path, timeout: float) -> dict[str, str]:
    """Run mutmut's mutants ``names`` in one pytest process (``_python_loop``): the package is
    mutmut's copy in mutants/, the tests are the repository's."""
    import tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["mutmut"]
    tests = settings["pytest_add_cli_args_test_selection"]
    path = ROOT / "mutants" / "path"
    path.mkdir(exist_ok=True)
    if not (path / "receiver").exists():
        (path / "receiver").symlink_to(ROOT / "mutants" / "receiver", target_is_directory=True)
    listed = results.with_suffix(".ids")
    listed.write_text("\n".join(names) + "\n", "utf-8")
    # -P and --import-mode=append: neither Python nor pytest puts the repository's directory
    # ahead of the copy, whose receiver/ must be the one imported.
    command = [
        sys.executable,
        "-P",
        "-m",
        "pytest",
        "--import-mode=append",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.mutation.plugin",
        "-o",
        "addopts=",
        f"--py-mutants={listed}",
        f"--sql-results={results}",
        f"--sql-timeout={timeout}",
        *tests,
    ]
    results.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{path}{os.pathsep}{ROOT}"}
    done = subprocess.run(command, cwd=ROOT, env=env, check=False)
    if done.returncode not in (0, 5) or not results.exists():
        raise SystemExit(f"the mutation run failed ({done.returncode})")
    outcome: dict[str, str] = json.loads(results.read_text("utf-8"))["outcome"]
    return outcome


def python_table(outcome: dict[str, str]) -> str:
    """Per module: mutants run, killed, equivalent, survived (of which no test reaches), and
    the score (killed / (run - equivalent))."""
    rows: dict[str, list[int]] = {}
    survivors: list[str] = []
    for name, result in outcome.items():
        module = re.sub(r"\.x[_\u01c1].*$", "", name)
        row = rows.setdefault(module, [0, 0, 0, 0, 0])
        row[0] += 1
        if result in ("killed", "timeout"):
            row[1] += 1
        elif name in PY_EQUIVALENT:
            row[2] += 1
        else:
            row[3] += 1
            row[4] += result == "no tests"
            survivors.append(
                f"SURVIVED {name}" + (" (no test calls it)" if result == "no tests" else "")
            )
    out = [
        f"{'module':32} {'mutants':>7} {'killed':>6} {'equiv':>5} {'alive':>5} {'untested':>8} "
        f"{'score':>6}"
    ]
    for module, (n, killed, equivalent, alive, untested) in sorted(rows.items()):
        live = n - equivalent
        score = f"{100 * killed / live:5.1f}%" if live else "  -  "
        out.append(f"{module:32} {n:7} {killed:6} {equivalent:5} {alive:5} {untested:8} {score:>6}")
    return "\n".join(out + sorted(survivors))
