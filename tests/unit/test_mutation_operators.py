"""scripts/mutate's SQL mutator (tests/mutation.py) still finds what it mutates in the current
``.sql`` files: an edit of a statement that made an operator stop matching would otherwise
lower the number of mutants silently, and the score would look better than it is."""

from __future__ import annotations

from collections import Counter

import pytest

from receiver._store.queries import DIALECTS, parse, queries
from tests.mutation import sql as mutation

FENCED = ("reclaim", "complete", "release", "unresolve", "extend_lease", "reopen")


@pytest.fixture(scope="module")
def found() -> list[mutation.Mutant]:
    return mutation.mutants()


def test_every_statement_mutated_is_one_of_the_ledger(found: list[mutation.Mutant]) -> None:
    for dialect in DIALECTS:
        names = set(queries(dialect))
        expected = set(mutation.STATEMENTS) - ({"claim_many"} if dialect == "sqlite" else set())
        assert expected <= names
        assert {m.statement for m in found if m.dialect == dialect} == expected


@pytest.mark.parametrize("operator", sorted(mutation.OPERATORS))
def test_each_operator_applies_in_each_dialect(found: list[mutation.Mutant], operator: str) -> None:
    per_dialect = Counter(m.dialect for m in found if m.operator == operator)
    assert set(per_dialect) == set(DIALECTS), per_dialect


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("statement", FENCED)
def test_each_fence_is_dropped_once(
    found: list[mutation.Mutant], dialect: str, statement: str
) -> None:
    fences = [
        m
        for m in found
        if (m.dialect, m.statement, m.operator) == (dialect, statement, "drop-fence")
    ]
    assert len(fences) == 1


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("statement", ["complete", "release", "unresolve", "extend_lease"])
def test_the_in_flight_condition_is_widened_by_every_other_state(
    found: list[mutation.Mutant], dialect: str, statement: str
) -> None:
    widened = {
        m.description
        for m in found
        if (m.dialect, m.statement, m.operator) == (dialect, statement, "widen-state")
    }
    others = [s for s in mutation.STATES if s != "in_flight"]
    assert widened == {f"state 'in_flight' widened by '{s}'" for s in others}


def test_each_mutant_changes_exactly_its_own_statement(found: list[mutation.Mutant]) -> None:
    ids = [m.id for m in found]
    assert len(ids) == len(set(ids))
    for m in found:
        text = mutation.ROOT.joinpath(mutation.DIALECT_FILES[m.dialect]).read_text("utf-8")
        mutated = parse(m.text)
        original = parse(text)
        assert mutated[m.statement] != original[m.statement], m.id
        assert {k: v for k, v in mutated.items() if k != m.statement} == {
            k: v for k, v in original.items() if k != m.statement
        }, m.id
        assert set(mutated) == set(original)


def test_each_equivalent_mutant_explained_is_still_a_mutant(found: list[mutation.Mutant]) -> None:
    """An edit of the SQL renumbers mutants: an explanation must not outlive its mutant."""
    assert set(mutation.EQUIVALENT) <= {m.id for m in found}
