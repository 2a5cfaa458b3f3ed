"""``python -m tests.mutation``: list, run and tabulate the mutants (scripts/mutate).

python -m tests.mutation list                     # every SQL mutant: id, the changed line
python -m tests.mutation run [--only ID...]       # run them; a table per statement
python -m tests.mutation python-run [--only P...] # mutmut's mutants of the Python
python -m tests.mutation table | python-table     # the tables of the last runs
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from .python import generate_python, python_mutants, python_table, run_python
from .sql import ROOT, TESTS, mutants, run, table

SQL_RESULTS = ROOT / "mutants" / "sql.json"
PY_RESULTS = ROOT / "mutants" / "python.json"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation")
    parser.add_argument("command", choices=("list", "run", "table", "python-run", "python-table"))
    parser.add_argument("--only", nargs="*", default=[], help="mutant ids or id prefixes")
    parser.add_argument("--results", type=Path, default=SQL_RESULTS)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--tests", nargs="*", default=list(TESTS))
    parser.add_argument("--skip", type=Path, help="results of a run whose killed mutants to skip")
    args = parser.parse_args(argv)
    if args.command.startswith("python-"):
        results = args.results if args.results != SQL_RESULTS else PY_RESULTS
        if args.command == "python-run":
            results.parent.mkdir(parents=True, exist_ok=True)
            generate_python()
            names = python_mutants(args.only)
            done: dict[str, str] = {}
            if args.skip is not None:
                done = json.loads(args.skip.read_text("utf-8"))["outcome"]
                done = {k: v for k, v in done.items() if v in ("killed", "timeout")}
            names = [n for n in names if n not in done]
            outcome = {**done, **run_python(names, results, args.timeout)}
            results.write_text(json.dumps({"outcome": outcome}, indent=1), "utf-8")
        elif not results.exists():
            print(f"no results yet ({results})")
            return
        else:
            outcome = json.loads(results.read_text("utf-8"))["outcome"]
        print(python_table(outcome))
        return
    selected = [m for m in mutants() if not args.only or any(m.id.startswith(p) for p in args.only)]
    if args.command == "list":
        for m in selected:
            print(f"{m.id:45} line {m.line:4}  {m.description}")
        return
    if args.command == "table":
        if not args.results.exists():
            print(f"no results yet ({args.results})")
            return
        outcome = json.loads(args.results.read_text("utf-8"))["outcome"]
    else:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        outcome = run(selected, args.tests, args.results, args.timeout)
    print(table(selected, outcome))


if __name__ == "__main__":
    main()
