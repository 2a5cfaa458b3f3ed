"""The two dialects define the same statements with the same parameters."""

import re

import pytest

from receiver._store.queries import DIALECTS, parse, queries, runner_queries


def parameters(sql: str) -> set[int]:
    return {int(n) for n in re.findall(r"[$?](\d+)", sql)}


# The micro-batcher's statements exist where a store batches (PostgreSQL): they save round
# trips, and SQLite, in-process with one writer, has none to save.
BATCH_ONLY = {"claim_many"}


def test_both_dialects_define_the_same_statements() -> None:
    names = [set(queries(d)) for d in DIALECTS]
    assert names[0] - BATCH_ONLY == names[1]
    assert names[0] >= BATCH_ONLY
    assert {"claim", "lookup", "reclaim", "complete", "release", "stale"} <= names[0]


@pytest.mark.parametrize("name", sorted(set(queries("postgresql")) - BATCH_ONLY))
def test_same_positional_parameters(name: str) -> None:
    assert parameters(queries("postgresql")[name]) == parameters(queries("sqlite")[name])


def test_the_claim_is_one_insert_on_conflict_do_nothing() -> None:
    for dialect in DIALECTS:
        claim = " ".join(queries(dialect)["claim"].split())
        assert claim.count("INSERT INTO receiver_receipts") == 1
        assert claim.count(";") == 0  # one statement
        # PostgreSQL names no arbiter: the single table's is its primary key, the partitioned
        # layout's the key table (receiver/_store/partitions.py), which no inference names.
        target = "" if dialect == "postgresql" else "(provider, webhook_id) "
        assert f"ON CONFLICT {target}DO NOTHING RETURNING" in claim
        assert "UPDATE" not in claim


def test_completion_and_release_are_fenced() -> None:
    for dialect in DIALECTS:
        for name in ("complete", "release", "extend_lease", "reclaim"):
            sql = queries(dialect)[name]
            assert "fence = " in sql, (dialect, name)
            assert "webhook_id = " in sql, (dialect, name)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_the_migration_runner_has_the_same_statements_in_both_dialects() -> None:
    names = [set(runner_queries(d)) for d in DIALECTS]
    assert names[0] == names[1]
    assert {"create_table", "applied", "record", "tables"} <= names[0]
