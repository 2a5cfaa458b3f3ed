"""The ledger's SQL mutants: operators that each make one small, plausible mistake in one
statement of one dialect's queries file, the mutants they make, and the equivalent ones.

No Python mutation tester reads ``.sql`` files, hence this mutator: a fence condition dropped,
``DO NOTHING`` turned into an update, a state condition widened, a comparison flipped, an
assignment or a ``RETURNING`` column dropped, an increment lost. A mutant is the file with that
one change; :mod:`tests.mutation.plugin` runs the covering tests against it, in memory (the
repository's files are never written).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from receiver._store.queries import parse

ROOT = Path(__file__).resolve().parent.parent.parent
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
        "tests.mutation.plugin",
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
