"""Mutation testing of the ledger's SQL (scripts/mutate): mutmut mutates the Python, this module
the ``.sql`` files, which no Python mutation tester reads.

Each operator makes one small, plausible mistake in one statement of one dialect's queries file
(a fence condition dropped, ``DO NOTHING`` turned into an update, a state condition widened, a
comparison flipped, an assignment or a ``RETURNING`` column dropped, an increment lost). A
mutant is the file with that one change; the runner writes it into a scratch copy of the
repository, runs the tests that cover the statement against it (the real stores of the
dialect), and records whether they failed (killed) or passed (survived). The repository's own
files are never touched.

    python -m tests.mutation list                 # every mutant: id, operator, the changed line
    python -m tests.mutation run [--only ID...]   # run them; a table per statement at the end

A survivor is either a missing test or an equivalent mutant (the change alters no behaviour);
:data:`EQUIVALENT` says why for each of those, and the table counts them apart
(CONTRIBUTING.md, "Mutation testing").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from receiver._store.queries import parse

ROOT = Path(__file__).resolve().parent.parent
SQL = Path("receiver/_store/sql")

#: The statements mutated: claim, fence, completion, release and recovery.
STATEMENTS = (
    "claim",
    "claim_many",
    "lookup",
    "reclaim",
    "complete",
    "release",
    "unresolve",
    "record_attempt",
    "extend_lease",
    "stale",
    "reopen",
)
DIALECT_FILES = {
    "postgresql": SQL / "queries.postgresql.sql",
    "sqlite": SQL / "queries.sqlite.sql",
}
#: The tests that cover the statements, on the real stores: the direct tests of each
#: statement first, then the ledger's time, recovery, expiry, review, replay and batching
#: tests. The state machine (test_state_machine.py) is not among them: in a full run it killed
#: no mutant the others missed, and it doubles what each survivor costs
#: (``--tests`` adds it).
TESTS = (
    "tests/integration/test_ledger_fences.py",
    "tests/integration/test_ledger_time.py",
    "tests/integration/test_sweeper.py",
    "tests/integration/test_expiry.py",
    "tests/integration/test_needs_review.py",
    "tests/integration/test_replay.py",
    "tests/integration/test_batching.py",
)
STATES = ("in_flight", "released", "completed", "failed", "queued")

#: Survivors that change no behaviour, by mutant id, with the reason (CONTRIBUTING.md lists
#: them too).
_SNAPSHOT = (
    "the statement reads the snapshot it started with, which never holds the rows its own "
    "INSERT writes (a data-modifying CTE's rows are invisible to the rest of the statement), "
    "and the drift is only computed for a key the INSERT won, which no row had"
)
_IN_FLIGHT_RELEASED = (
    "a released receipt is taken by the first branch (state = 'released') whatever its "
    "lease: adding it to the in-flight branch adds no row"
)
_QUEUED_DUE = (
    "every statement that writes state 'queued' sets due_at (enqueue, queue_retry, "
    "queue_requeue, queue_release, queue_reopen, console_requeue_completed) and none clears "
    "it, so due_at IS NULL already leaves every queued receipt out"
)
EQUIVALENT: dict[str, str] = {
    "postgresql:claim:drop-condition:2": _SNAPSHOT,
    "postgresql:claim:drop-condition:5": (
        "when the INSERT wins, the snapshot holds no row of the key (it is the primary key), "
        "so the second branch is empty without NOT EXISTS too"
    ),
    "postgresql:claim_many:drop-condition:2": (
        "the drift of a row that did not win its key is never read: claim_many() reads it "
        "only where claimed is true, which needs f.n = i.n itself"
    ),
    "postgresql:claim_many:drop-condition:4": _SNAPSHOT,
    "postgresql:reclaim:widen-state:5": _IN_FLIGHT_RELEASED,
    "sqlite:reclaim:widen-state:5": _IN_FLIGHT_RELEASED,
    "postgresql:stale:widen-state:4": _QUEUED_DUE,
    "sqlite:stale:widen-state:4": _QUEUED_DUE,
}

Lines = list[str]
#: An operator: (the statement's lines, the index of a line of code) -> the mutated lines of
#: the statement, one list per mutant, each with a short description.
Operator = Callable[[Lines, int], Iterator[tuple[Lines, str]]]


def _replace(lines: Lines, i: int, new: str) -> Lines:
    return [*lines[:i], new, *lines[i + 1 :]]


def _subs(
    pattern: re.Pattern[str], line: str, repl: Callable[[re.Match[str]], str]
) -> Iterator[str]:
    """``line`` with one match of ``pattern`` replaced, for each match in turn."""
    for m in pattern.finditer(line):
        yield line[: m.start()] + repl(m) + line[m.end() :]


_FENCE = re.compile(r"\s+AND\s+(?:\w+\.)?fence\s*=\s*[$?]\d+")
# A parenthesised group, a function call, or a plain operand.
_NESTED = r"\((?:[^()]|\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))*\)"  # up to four levels
_CALL = rf"[\w.]+{_NESTED}"
_OPERAND = rf"(?:{_CALL}|'[^']*'|[$?]\d+(?:::\w+)?|[\w.]+)"
_CONJUNCT = re.compile(
    rf"\s+AND\s+[\w.]+(?:\s+COLLATE\s+\"C\")?\s*"
    rf"(?:(?:<=|>=|<>|=|<|>)\s*{_OPERAND}(?:\s*[-+]\s*{_OPERAND})?|IS\s+(?:NOT\s+)?NULL)"
    rf"|\s+AND\s+NOT\s+EXISTS\s*{_NESTED}"
)
_STATE = re.compile(
    r"(?:(?<=WHERE )|(?<=AND )|(?<=OR )|(?<=\())(\w+\.)?state(\s+COLLATE\s+\"C\")?\s*=\s*'(\w+)'"
)
_COMPARISON = re.compile(r"<=|>=|<>|(?<![<>-])[<>](?![=>])")
_FLIPPED = {"<=": "<", ">=": ">", "<>": "=", "<": "<=", ">": ">="}
_INCREMENT = re.compile(r"\b(\w+) \+ 1\b")
_DO_NOTHING = re.compile(r"DO NOTHING")
_RETURNING = re.compile(r"^(\s*RETURNING\s+)(.+?)(;?)$")
_OR_BRANCH = re.compile(rf"\s+OR\s+{_NESTED}")


def _true(m: re.Match[str]) -> str:
    """``AND x`` made always true, ``AND (x OR true)``: a condition dropped, its parameters
    still in the statement (PostgreSQL refuses a statement with a parameter it cannot type,
    which would kill the mutant for the wrong reason)."""
    condition = m.group().strip()[len("AND") :].strip()
    return f" AND ({condition} OR true)"


def drop_fence(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """A fenced statement that forgets its fence: a stale attempt writes over a newer one."""
    for new in _subs(_FENCE, lines[i], _true):
        yield _replace(lines, i, new), "fence condition dropped"


def drop_condition(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """One ``AND`` condition of a WHERE clause dropped (the fence's is drop-fence's)."""
    for m in _CONJUNCT.finditer(lines[i]):
        if _FENCE.fullmatch(m.group()):
            continue
        new = lines[i][: m.start()] + _true(m) + lines[i][m.end() :]
        yield _replace(lines, i, new), f"dropped {m.group().strip()!r}"


def widen_state(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """A state condition that also accepts one other state."""
    for m in _STATE.finditer(lines[i]):
        prefix, state = m.group(1) or "", m.group(3)
        for other in STATES:
            if other == state:
                continue
            new = f"{prefix}state IN ('{state}', '{other}')"
            line = lines[i][: m.start()] + new + lines[i][m.end() :]
            yield _replace(lines, i, line), f"state '{state}' widened by '{other}'"


def flip_comparison(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """``<=`` for ``<`` and the like: a boundary judged the other way."""
    line = lines[i]
    for m in _COMPARISON.finditer(line):
        op = m.group()
        new = line[: m.start()] + _FLIPPED[op] + line[m.end() :]
        yield _replace(lines, i, new), f"{op} -> {_FLIPPED[op]}"


def drop_increment(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """``fence + 1`` (or ``attempts + 1``) left as it was."""
    for m in _INCREMENT.finditer(lines[i]):
        new = lines[i][: m.start()] + m.group(1) + lines[i][m.end() :]
        yield _replace(lines, i, new), f"{m.group()} -> {m.group(1)}"


def do_update(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """``ON CONFLICT DO NOTHING`` turned into an update that changes nothing but returns the
    existing row, as if this caller had inserted it."""
    line = lines[i]
    for m in _DO_NOTHING.finditer(line):
        target = "" if "(provider, webhook_id)" in line else "(provider, webhook_id) "
        new = f"{target}DO UPDATE SET fence = receiver_receipts.fence"
        yield (
            _replace(lines, i, line[: m.start()] + new + line[m.end() :]),
            "DO NOTHING -> DO UPDATE",
        )


_DO_UPDATE = re.compile(r"DO UPDATE SET .*?(?=;?$)")


def do_nothing(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """An upsert's ``DO UPDATE`` turned into ``DO NOTHING``: the row first written stays."""
    for new in _subs(_DO_UPDATE, lines[i], lambda m: "DO NOTHING"):
        yield _replace(lines, i, new), "DO UPDATE -> DO NOTHING"


def drop_returning(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """One column of a one-line ``RETURNING`` list dropped."""
    m = _RETURNING.match(lines[i])
    if m is None:
        return
    listed, more = m.group(2), ""
    if listed.endswith(","):  # the list goes on on the next line
        listed, more = listed[:-1], ","
    columns = [c.strip() for c in listed.split(",")]
    if len(columns) + bool(more) < 2 or any("(" in c or ")" in c for c in columns):
        return
    for k, column in enumerate(columns):
        kept = ", ".join(columns[:k] + columns[k + 1 :])
        new = m.group(1) + kept + (more if kept else "") + m.group(3)
        yield _replace(lines, i, new), f"RETURNING without {column}"


_ASSIGNMENT = re.compile(r"^(\s*(?:SET\s+)?)(\w+) = (.*?)(,?)$")


def drop_assignment(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """One assignment of an UPDATE's SET list dropped (one assignment a line): the column
    keeps its value. Written ``col = CASE WHEN false THEN <value> ELSE col END`` so that the
    value's parameters stay in the statement (see :func:`_true`)."""
    line = lines[i]
    m = _ASSIGNMENT.match(line)
    if m is None or not (m.group(1).strip().startswith("SET") or _in_set(lines, i)):
        return
    indent, column, value, comma = m.groups()
    kept = f"{indent}{column} = CASE WHEN false THEN {value} ELSE {column} END{comma}"
    yield _replace(lines, i, kept), f"dropped {line.strip()!r}"


def _in_set(lines: Lines, i: int) -> bool:
    for line in reversed(lines[:i]):
        if re.match(r"^\s*SET\s", line):
            return True
        if not line.rstrip().endswith(","):
            return False
    return False


def drop_branch(lines: Lines, i: int) -> Iterator[tuple[Lines, str]]:
    """One ``OR (...)`` alternative of a condition dropped."""
    for m in _OR_BRANCH.finditer(lines[i]):
        new = lines[i][: m.start()] + lines[i][m.end() :]
        yield _replace(lines, i, new), f"dropped {m.group().strip()!r}"


OPERATORS: dict[str, Operator] = {
    "drop-fence": drop_fence,
    "do-update": do_update,
    "do-nothing": do_nothing,
    "widen-state": widen_state,
    "drop-condition": drop_condition,
    "drop-branch": drop_branch,
    "flip-comparison": flip_comparison,
    "drop-increment": drop_increment,
    "drop-assignment": drop_assignment,
    "drop-returning": drop_returning,
}


@dataclass(frozen=True)
class Mutant:
    id: str  # dialect:statement:operator:n, stable while the statement's text is
    dialect: str
    statement: str
    operator: str
    line: int  # 1-based, in the dialect's file
    description: str
    text: str  # the whole mutated file


def blocks(text: str) -> dict[str, tuple[int, int]]:
    """Each statement's lines in ``text``: name -> (first line after its header, end)."""
    lines = text.splitlines()
    starts = [
        (i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"^-- name: (\w+)", line))
    ]
    ends = [i for i, _ in starts[1:]] + [len(lines)]
    return {name: (i + 1, end) for (i, name), end in zip(starts, ends, strict=True)}


def mutants(root: Path = ROOT, operators: Sequence[str] = tuple(OPERATORS)) -> list[Mutant]:
    """Every mutant of :data:`STATEMENTS` in both dialects' files under ``root``."""
    found: list[Mutant] = []
    for dialect, path in DIALECT_FILES.items():
        text = (root / path).read_text("utf-8")
        original = parse(text)
        lines = text.splitlines()
        for name, (start, end) in blocks(text).items():
            if name not in STATEMENTS:
                continue
            body = lines[start:end]
            for op in operators:
                n = 0
                for i, line in enumerate(body):
                    if line.lstrip().startswith("--") or not line.strip():
                        continue
                    code = line.split(" --", 1)[0]  # a trailing comment is not code
                    comment = line[len(code) :]
                    for mutated, description in OPERATORS[op]([*body[:i], code, *body[i + 1 :]], i):
                        if mutated[i : i + 1] and mutated[i] != code and len(mutated) == len(body):
                            mutated[i] += comment
                        new_text = "\n".join([*lines[:start], *mutated, *lines[end:]]) + "\n"
                        if parse(new_text)[name] == original[name]:
                            continue  # not a change of the statement
                        n += 1
                        found.append(
                            Mutant(
                                f"{dialect}:{name}:{op}:{n}",
                                dialect,
                                name,
                                op,
                                start + i + 1,
                                description,
                                new_text,
                            )
                        )
    return found


# The runner: one pytest process for every mutant. Its session fixtures (the PostgreSQL
# databases) are made once; each mutant swaps one dialect's statements in memory (the repository's
# files stay as they are) and runs that dialect's covering tests again, stopping at the first
# failure. A process the tests start (none of the covering tests do) would run the real SQL.


class MutantTimeout(Exception):
    """The covering tests ran past the mutant's time: it hangs, which is a failure (killed)."""


def _alarm(signum: int, frame: object) -> None:
    raise MutantTimeout("the tests ran out of time on this mutant")


@contextlib.contextmanager
def applied(mutant: Mutant | None) -> Iterator[None]:
    """The ledger's statements with ``mutant`` in place (None: as they are)."""
    from receiver._store import queries as module

    read = module._read

    def mutated(*path: str) -> str:
        if mutant is not None and Path(SQL, *path) == DIALECT_FILES[mutant.dialect]:
            return mutant.text
        return read(*path)

    module._read = mutated
    module.queries.cache_clear()
    try:
        yield
    finally:
        module._read = read
        module.queries.cache_clear()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sql mutants (tests/mutation.py)")
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


def run(
    selected: Sequence[Mutant], tests: Sequence[str], results: Path, timeout: float
) -> dict[str, str]:
    """Run the ``selected`` mutants in one pytest process: their outcomes."""
    listed = results.with_suffix(".ids")
    listed.write_text("\n".join(m.id for m in selected) + "\n", "utf-8")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.mutation",
        "-o",
        "addopts=",
        f"--sql-mutants={listed}",
        f"--sql-results={results}",
        f"--sql-timeout={timeout}",
        *tests,
    ]
    results.unlink(missing_ok=True)
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False
    )
    if done.returncode not in (0, 5) or not results.exists():
        raise SystemExit(f"the mutation run failed ({done.returncode})")
    outcome: dict[str, str] = json.loads(results.read_text("utf-8"))["outcome"]
    return outcome


def table(selected: Sequence[Mutant], outcome: dict[str, str]) -> str:
    """Per statement and dialect: mutants, killed, equivalent, survived, and the score
    (killed / (mutants - equivalent))."""
    rows: dict[tuple[str, str], list[int]] = {}
    survivors = []
    for m in selected:
        if m.id not in outcome:
            continue
        row = rows.setdefault((m.statement, m.dialect), [0, 0, 0, 0])
        row[0] += 1
        if outcome[m.id] in ("killed", "timeout"):
            row[1] += 1
        elif m.id in EQUIVALENT:
            row[2] += 1
        else:
            row[3] += 1
            survivors.append(m)
    out = [
        f"{'statement':16} {'dialect':10} {'mutants':>7} {'killed':>6} {'equiv':>5} "
        f"{'alive':>5} {'score':>6}"
    ]
    total = [0, 0, 0, 0]
    for (statement, dialect), row in sorted(rows.items()):
        total = [a + b for a, b in zip(total, row, strict=True)]
        out.append(_row(statement, dialect, row))
    out.append(_row("all", "", total))
    for m in survivors:
        out.append(f"SURVIVED {m.id} (line {m.line}): {m.description}")
    return "\n".join(out)


def _row(statement: str, dialect: str, row: list[int]) -> str:
    mutants_, killed, equivalent, alive = row
    live = mutants_ - equivalent
    score = f"{100 * killed / live:5.1f}%" if live else "  -  "
    return (
        f"{statement:16} {dialect:10} {mutants_:7} {killed:6} {equivalent:5} {alive:5} {score:>6}"
    )


#: Python survivors that change no behaviour, by mutmut's mutant name, with the reason.
PY_EQUIVALENT: dict[str, str] = {
    "receiver._ledger.receipts.x_encode_headers__mutmut_2": (
        "no headers stored as [] instead of NULL: the column is only read through "
        "decode_headers(), which gives () for both"
    ),
    "receiver._webhooks.recovery.x\u01c1Recovery\u01c1recover__mutmut_1": (
        "recover(reconcile=)'s default: no caller uses it (Pipeline.recover always passes it)"
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
        "tests.mutation",
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
