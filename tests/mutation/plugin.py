"""The runner, a pytest plugin (``-p tests.mutation.plugin``): one pytest process for every
mutant. Its session fixtures (the PostgreSQL databases) are made once; each mutant runs its
covering tests again, stopping at the first failure. A process the tests start (none of the
covering tests do) would run the code unmutated."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from .sql import DIALECT_FILES, Mutant, applied, mutants


class MutantTimeout(Exception):
    """The covering tests ran past the mutant's time: it hangs, which is a failure (killed)."""


def _alarm(signum: int, frame: object) -> None:
    raise MutantTimeout("the tests ran out of time on this mutant")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mutants (tests/mutation)")
    group.addoption("--sql-mutants", default="", help="a file of mutant ids, one a line")
    group.addoption("--sql-results", default="", help="where the outcomes go (JSON)")
    group.addoption("--sql-timeout", type=float, default=120.0)
    group.addoption("--py-mutants", default="", help="a file of mutmut's mutant names")
    group.addoption("--py-budget", type=float, default=10.0, help="seconds of tests per mutant")


def _of(dialect: str, item: pytest.Item) -> bool:
    """Whether ``item`` runs for a mutant of ``dialect``: a test of one store (its parameter
    names it) runs for that store's dialect, PostgreSQL's single table standing for both its
    layouts (the partitioned layout runs the same statements; its own arbiter is
    tests/integration/test_partitions.py's); any other test runs for both."""
    callspec = getattr(item, "callspec", None)
    kinds = set(callspec.id.split("-")) & {*DIALECT_FILES, "partitioned"} if callspec else set()
    return not kinds or dialect in kinds


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    config = session.config
    if config.getoption("py_mutants"):
        return _python_loop(session)
    listed = config.getoption("sql_mutants")
    if not listed:
        return None
    wanted = Path(listed).read_text("utf-8").split()
    selected = [m for m in mutants() if m.id in wanted]
    results = Path(config.getoption("sql_results"))
    timeout = float(config.getoption("sql_timeout"))
    report = config.pluginmanager.getplugin("terminalreporter")
    say: Callable[[str], None] = report.write_line if report is not None else print
    runs: list[tuple[Mutant | None, list[pytest.Item]]] = [
        (None, [i for i in session.items if _of(d, i)]) for d in DIALECT_FILES
    ]
    runs += [(m, [i for i in session.items if _of(m.dialect, i)]) for m in selected]
    outcome: dict[str, str] = {}
    baseline: dict[str, float] = {}
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for n, (mutant, items) in enumerate(runs):
            following = runs[n + 1][1][0] if n + 1 < len(runs) else None
            began = time.monotonic()
            # A mutant may make the tests slower without failing them: only three times the
            # baseline's time counts as a hang.
            limit = None if mutant is None else max(timeout, 3 * baseline[mutant.dialect])
            with applied(mutant):
                failed = _run_items(items, following, limit)
            took = time.monotonic() - began
            if mutant is None:
                if failed is not None:
                    raise pytest.UsageError(f"{failed.nodeid} fails without any mutant")
                baseline[list(DIALECT_FILES)[n]] = took
                say(f"baseline: {len(items)} tests passed in {took:.0f}s")
                continue
            outcome[mutant.id] = "survived" if failed is None else "killed"
            if isinstance(failed, _TimedOut):
                outcome[mutant.id] = "timeout"
            by = "" if failed is None else f" by {failed.nodeid}"
            say(f"{outcome[mutant.id]:8} {took:5.1f}s {mutant.id}  {mutant.description}{by}")
            if results.name:
                results.write_text(json.dumps({"outcome": outcome}, indent=1), "utf-8")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return True


def _python_loop(session: pytest.Session) -> bool:
    """mutmut's mutants (its copy of the package, first on the path), each run against the
    tests that call the function it changes: found here once, by running every test with
    mutmut's trampolines recording the calls."""
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.state import state
    from mutmut.utils.format_utils import mangled_name_from_mutant_name

    import receiver

    if "mutants" not in Path(receiver.__file__).parts:
        raise pytest.UsageError(f"receiver is not mutmut's copy here: {receiver.__file__}")
    config = session.config
    names = Path(config.getoption("py_mutants")).read_text("utf-8").split()
    results = Path(config.getoption("sql_results"))
    timeout = float(config.getoption("sql_timeout"))
    budget = float(config.getoption("py_budget"))
    report = config.pluginmanager.getplugin("terminalreporter")
    say: Callable[[str], None] = report.write_line if report is not None else print
    items = [i for i in session.items if not _on_partitions(i)]
    hits: dict[str, set[str]] = {}
    took: dict[str, float] = {}
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        set_mutant_under_test("stats")
        for k, item in enumerate(items):
            state()._stats.clear()
            began = time.monotonic()
            failed = _run_items([item], items[k + 1] if k + 1 < len(items) else items[0], None)
            if failed is not None:
                raise pytest.UsageError(f"{failed.nodeid} fails without any mutant")
            took[item.nodeid] = time.monotonic() - began
            for function in state()._stats:
                hits.setdefault(function, set()).add(item.nodeid)
        say(f"baseline: {len(items)} tests passed in {sum(took.values()):.0f}s")
        outcome: dict[str, str] = {}
        for name in names:
            covering = hits.get(mangled_name_from_mutant_name(name), set())
            chosen = _budgeted(
                sorted((i for i in items if i.nodeid in covering), key=_order(took)), took, budget
            )
            if not chosen:
                outcome[name] = "no tests"
                continue
            set_mutant_under_test(name)
            began = time.monotonic()
            limit = max(timeout, 3 * sum(took[i.nodeid] for i in chosen))
            failed = _run_items(chosen, items[0], limit)
            set_mutant_under_test("")
            outcome[name] = "survived" if failed is None else "killed"
            if isinstance(failed, _TimedOut):
                outcome[name] = "timeout"
            by = "" if failed is None else f" by {failed.nodeid}"
            say(f"{outcome[name]:8} {time.monotonic() - began:5.1f}s {name}{by}")
            results.write_text(json.dumps({"outcome": outcome}, indent=1), "utf-8")
        results.write_text(json.dumps({"outcome": outcome}, indent=1), "utf-8")
    finally:
        set_mutant_under_test("")
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        session._setupstate.teardown_exact(None)
    return True


def _order(took: dict[str, float]) -> Callable[[pytest.Item], tuple[bool, float]]:
    """The direct tests of the ledger's statements first, then the fastest."""
    return lambda i: ("test_ledger_fences" not in i.nodeid, took[i.nodeid])


def _budgeted(
    items: Sequence[pytest.Item], took: dict[str, float], budget: float
) -> list[pytest.Item]:
    """The first of ``items`` whose baseline time fits in ``budget`` seconds (at least one):
    a function that every test calls would otherwise cost the whole suite per survivor. A
    survivor is then a mutant none of these tests kill, which CONTRIBUTING.md says."""
    chosen: list[pytest.Item] = []
    spent = 0.0
    for item in items:
        direct = "test_ledger_fences" in item.nodeid  # always: they are what kills most
        if chosen and not direct and spent + took[item.nodeid] > budget:
            continue
        chosen.append(item)
        spent += took[item.nodeid]
    return chosen


def _on_partitions(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "partitioned" in callspec.id.split("-")


class _TimedOut:
    def __init__(self, item: pytest.Item) -> None:
        self.nodeid = item.nodeid


def _run_items(
    items: Sequence[pytest.Item], following: pytest.Item | None, timeout: float | None
) -> pytest.Item | _TimedOut | None:
    """Run ``items`` until one fails: that one (None if all pass); the fixtures that
    ``following`` needs stay set up."""
    from _pytest.runner import runtestprotocol

    if timeout is not None:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        for k, item in enumerate(items):
            nextitem = items[k + 1] if k + 1 < len(items) else following
            try:
                reports = runtestprotocol(item, nextitem=nextitem, log=False)
            except MutantTimeout:
                item.session._setupstate.teardown_exact(following)
                return _TimedOut(item)
            if any(r.failed for r in reports):
                item.session._setupstate.teardown_exact(following)
                timed_out = any("MutantTimeout" in str(r.longrepr) for r in reports if r.failed)
                return _TimedOut(item) if timed_out else item
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
