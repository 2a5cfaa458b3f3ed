"""The migration files: numbered without gaps, the same in both dialects, 0001 exactly the
0.1.0 schema, and concurrent index builds that can run again after an interruption."""

from __future__ import annotations

import hashlib

import pytest

from receiver import ConfigurationError
from receiver._store.migrations import NO_TRANSACTION, load, migrations
from receiver._store.queries import DIALECTS

# sha256 of receiver 0.1.0's schema files (schema.sql and receiver/_store/sql/schema.sqlite.sql): a
# database created by 0.1.0 is taken to be at 0001, so 0001 must never change.
RELEASED_0_1_0 = {
    "postgresql": "4d140d4011d8078c39adb717a0bce8a6a8a94b170cf9305d67d07852b4858866",
    "sqlite": "2e84585659c91304a9911342adf778ea84d07ffb07fb6168a01a52cb147df5e5",
}


def test_both_dialects_have_the_same_migrations() -> None:
    labels = [[m.label for m in migrations(d)] for d in DIALECTS]
    assert labels[0] == labels[1]
    assert labels[0][:3] == ["0001_initial", "0002_response_headers", "0003_count_indexes"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_0001_is_the_released_0_1_0_schema(dialect: str) -> None:
    first = migrations(dialect)[0]
    assert hashlib.sha256(first.sql.encode()).hexdigest() == RELEASED_0_1_0[dialect]
    assert first.checksum == RELEASED_0_1_0[dialect]


def test_index_builds_on_postgresql_do_not_block_writes() -> None:
    for migration in migrations("postgresql")[1:]:  # 0001 built an empty table
        if "CREATE INDEX" in migration.sql.upper():
            assert "CONCURRENTLY" in migration.sql.upper(), migration.label
            assert not migration.transactional, migration.label


def test_gaps_and_bad_names_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="without gaps"):
        load("postgresql", {"0001_a.sql": "SELECT 1;", "0003_c.sql": "SELECT 1;"})
    with pytest.raises(ConfigurationError, match=r"NNNN_name\.sql"):
        load("postgresql", {"1_a.sql": "SELECT 1;"})


def test_a_concurrent_index_build_must_be_rerunnable_and_outside_a_transaction() -> None:
    build = "CREATE INDEX CONCURRENTLY {}x ON t (a);"
    with pytest.raises(ConfigurationError, match="no-transaction"):
        load("postgresql", {"0001_a.sql": build.format("IF NOT EXISTS ")})
    with pytest.raises(ConfigurationError, match="IF NOT EXISTS"):
        load("postgresql", {"0001_a.sql": f"{NO_TRANSACTION}\n" + build.format("")})
    (ok,) = load(
        "postgresql", {"0001_a.sql": f"{NO_TRANSACTION}\n" + build.format("IF NOT EXISTS ")}
    )
    assert not ok.transactional
