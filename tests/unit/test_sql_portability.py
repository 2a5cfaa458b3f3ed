"""The PostgreSQL SQL stays runnable on sharded PostgreSQL-compatible engines.

docs/explanation/scale-out.md says which engines the ledger can move to (Citus with the key as
the distribution column; YugabyteDB and CockroachDB, which speak PostgreSQL's protocol) and what
each needs from the SQL. This module reads every PostgreSQL SQL file of the package
(receiver/_store/sql/**, plus schema.sql) and holds it to those rules, but the partitioned
layout's (sql/layouts/): that layout is for one PostgreSQL (a trigger, functions, partition
DDL), and a sharded ledger keeps the single table:

1. Every primary key, unique constraint and unique index of a table sharded by the key
   contains the distribution column (``webhook_id``): a shard can only enforce uniqueness on
   what hashes to it.
2. Every write to a sharded table targets one key (``webhook_id = $n``), unless it is listed
   below as a multi-shard statement with the reason and the fallback.
3. The hot path (what a delivery, an action or a keyed request runs) reads one key per table
   reference, unless listed below with its fallback.
4. LISTEN/NOTIFY and advisory locks appear only where a fallback exists (listed below).
5. Nothing that no sharded engine offers: ctid, LOCK TABLE, temporary tables, triggers,
   functions, session SET.

The lists are the explicit exceptions: each must still be needed (a fixed statement drops its
entry), and the checker is shown to catch each rule on a statement that breaks it.

The checks read SQL text with regular expressions, not a parser: a table reference is judged by
its alias (``receiver_receipts r`` ... ``r.webhook_id = $2``), so two unaliased references to a
sharded table in one statement are judged together. Keep sharded tables aliased in statements
that read them twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from receiver._store.queries import parse, split_statements

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "receiver" / "_store" / "sql"

#: The distribution column: high-cardinality, in every keyed statement. (The provider, the
#: other half of the key, has a handful of values and would put a provider on one shard.)
SHARD_KEY = "webhook_id"

#: Tables that carry a webhook_id without being sharded by it: why, and what a port does.
UNSHARDED: Mapping[str, str] = {
    "receiver_audit": (
        "operator actions, a few per hour, keyed by a bigserial id: a Citus reference table "
        "(or a local table on the coordinator); never written on the hot path"
    ),
    "receiver_bulk_items": (
        "the keys of an operator's bulk replay, keyed by (job, seq), written by one runner at a "
        "time at a configured rate: a table colocated with receiver_bulk_jobs on the "
        "coordinator; never written on the hot path"
    ),
}

#: Statements that every delivery, agent action or keyed request may run.
HOT_PATH = frozenset(
    {
        "claim",
        "lookup",
        "reclaim",
        "complete",
        "release",
        "unresolve",
        "record_attempt",
        "extend_lease",
        "claim_many",
        "enqueue",
        "queue_complete",
        "queue_retry",
        "queue_reclaim",
        "queue_requeue",
        "queue_release",
    }
)

#: Hot-path table references that are not bound to one key: (statement, alias) -> fallback.
HOT_PATH_CROSS_SHARD: Mapping[tuple[str, str], str] = {
    ("claim", "d"): (
        "the key-drift probe (the same payload under another webhook-id, by payload_hash): "
        "read-only, it fans out to every shard; a port that cannot afford that drops the probe "
        "from the claim (the receiver_key_drift metric then stays at zero)"
    ),
}

#: Writes to a sharded table that touch many keys in one statement: why, and the fallback.
MULTI_SHARD_WRITES: Mapping[str, str] = {
    "claim_many": (
        "the micro-batcher's claims, many keys per statement; with the batcher off "
        "(batch size 1) every claim is the keyed claim statement"
    ),
    "enqueue": (
        "queued ingest, many keys per statement, with the key-drift probe and one NOTIFY per "
        "batch; with the ingest batch at 1 every insert is one key"
    ),
    "queue_fetch": (
        "the workers' fetch of due receipts (FOR UPDATE SKIP LOCKED over the due index): "
        "cross-shard by nature; Citus runs row locks on single-shard queries only, so the "
        "queued mode needs a fetch per shard there"
    ),
    "delete_expired": (
        "the sweeper's bounded batch of expired receipts: background work, off the hot path; "
        "per shard where the engine cannot lock across shards"
    ),
    "delete_orphan_attempts": "the sweeper's bounded batch of orphaned attempts, as above",
}

#: Session features that some engines lack: (statement, feature) -> the fallback.
SESSION_FEATURES: Mapping[tuple[str, str], str] = {
    ("enqueue", "pg_notify"): (
        "one NOTIFY per ingest batch to wake the workers; they poll every poll_interval "
        "anyway, so a port without NOTIFY drops the notified CTE and loses only latency"
    ),
    ("try_lock", "advisory"): (
        "the migration runner's lock; every migration statement is idempotent (IF NOT "
        "EXISTS, ON CONFLICT DO NOTHING), so without the lock run `receiver migrate` from one "
        "place at a time"
    ),
    ("unlock", "advisory"): "the same lock's release",
}

_FEATURES = {
    "pg_notify": re.compile(r"\bpg_notify\b|\bNOTIFY\b|\bLISTEN\b", re.IGNORECASE),
    "advisory": re.compile(r"\bpg_(?:try_)?advisory_\w+", re.IGNORECASE),
}

_UNPORTABLE = {
    "ctid": re.compile(r"\bctid\b", re.IGNORECASE),
    "LOCK TABLE": re.compile(r"\bLOCK\s+TABLE\b", re.IGNORECASE),
    "temporary table": re.compile(r"\bCREATE\s+(?:TEMP|TEMPORARY)\b", re.IGNORECASE),
    "trigger": re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?TRIGGER\b", re.IGNORECASE),
    "function": re.compile(
        r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\b", re.IGNORECASE
    ),
    # Session state (a transaction-mode pooler and a sharded engine's router break it);
    # SET LOCAL, scoped to one transaction, is fine.
    "session SET": re.compile(r"\A\s*SET\s+(?!LOCAL\b)", re.IGNORECASE),
}

_KEYWORDS = frozenset(
    [
        "where",
        "set",
        "on",
        "using",
        "join",
        "left",
        "right",
        "inner",
        "cross",
        "full",
        "natural",
        "lateral",
        "group",
        "order",
        "limit",
        "returning",
        "select",
        "from",
        "as",
        "union",
        "values",
        "default",
        "for",
        "with",
    ]
)


@dataclass(frozen=True)
class Statement:
    origin: str  # file, and the statement's name or index
    name: str
    sql: str  # comments removed


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def named_statements() -> Iterator[Statement]:
    """The named statements of the PostgreSQL queries files."""
    for path in sorted(SQL.glob("*.postgresql.sql")):
        for name, sql in parse(path.read_text("utf-8")).items():
            yield Statement(f"{path.name}:{name}", name, _strip_comments(sql))


def schema_statements() -> Iterator[Statement]:
    """The statements that build the schema: the migrations and schema.sql."""
    files = [*sorted((SQL / "migrations" / "postgresql").glob("*.sql")), ROOT / "schema.sql"]
    for path in files:
        for i, sql in enumerate(split_statements(path.read_text("utf-8"))):
            yield Statement(f"{path.name}#{i + 1}", path.stem, _strip_comments(sql))


def _columns(text: str) -> list[str]:
    """The column names of a key's column list (expressions keep their leading name)."""
    return [c.strip().split()[0].strip('"').lower() for c in _top_level_split(text) if c.strip()]


def _top_level_split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _parenthesised(text: str, open_at: int) -> str:
    """The text inside the parenthesis that opens at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    raise ValueError(f"unbalanced parentheses in {text!r}")


_CREATE_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\(", re.I)
_UNIQUE_INDEX = re.compile(
    r"\bCREATE\s+UNIQUE\s+INDEX\b[^(]*?\bON\s+(?:ONLY\s+)?(\w+)\s*(?:USING\s+\w+\s*)?\(", re.I
)
_ADD_KEY = re.compile(
    r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?(\w+)\s+ADD\s+(?:CONSTRAINT\s+\w+\s+)?"
    r"(?:PRIMARY\s+KEY|UNIQUE)\s*\(",
    re.I,
)
_ADD_COLUMN_KEY = re.compile(
    r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?(\w+)\s+ADD\s+(?:COLUMN\s+)?"
    r"(?:IF\s+NOT\s+EXISTS\s+)?(?!CONSTRAINT\b|PRIMARY\b|UNIQUE\b)(\w+)\s[^;]*?"
    r"\b(?:PRIMARY\s+KEY|UNIQUE)\b",
    re.I,
)
_KEY_ITEM = re.compile(r"^\s*(?:CONSTRAINT\s+\w+\s+)?(?:PRIMARY\s+KEY|UNIQUE)\s*\(", re.I)
_INLINE_KEY = re.compile(r"\b(?:PRIMARY\s+KEY|UNIQUE)\b", re.I)


@dataclass(frozen=True)
class Schema:
    columns: Mapping[str, frozenset[str]]
    keys: list[tuple[str, str, tuple[str, ...]]]  # (origin, table, key columns)

    def sharded(self) -> frozenset[str]:
        """Tables keyed by the delivery key, so sharded by it (less the listed exceptions)."""
        return frozenset(t for t, cols in self.columns.items() if SHARD_KEY in cols) - set(
            UNSHARDED
        )


def read_schema(statements: list[Statement]) -> Schema:
    columns: dict[str, set[str]] = {}
    keys: list[tuple[str, str, tuple[str, ...]]] = []
    for st in statements:
        for m in _CREATE_TABLE.finditer(st.sql):
            table = m.group(1).lower()
            body = _parenthesised(st.sql, m.end() - 1)
            for item in _top_level_split(body):
                if _KEY_ITEM.match(item):
                    cols = _columns(_parenthesised(item, item.index("(")))
                    keys.append((st.origin, table, tuple(cols)))
                elif item.strip() and not re.match(r"\s*(CONSTRAINT|CHECK)\b", item, re.I):
                    column = item.split()[0].strip('"').lower()
                    columns.setdefault(table, set()).add(column)
                    if _INLINE_KEY.search(item):
                        keys.append((st.origin, table, (column,)))
        for m in _UNIQUE_INDEX.finditer(st.sql):
            cols = _columns(_parenthesised(st.sql, m.end() - 1))
            keys.append((st.origin, m.group(1).lower(), tuple(cols)))
        for m in _ADD_KEY.finditer(st.sql):
            cols = _columns(_parenthesised(st.sql, m.end() - 1))
            keys.append((st.origin, m.group(1).lower(), tuple(cols)))
        for m in _ADD_COLUMN_KEY.finditer(st.sql):
            table, column = m.group(1).lower(), m.group(2).lower()
            columns.setdefault(table, set()).add(column)
            keys.append((st.origin, table, (column,)))
        for m in re.finditer(
            r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)\s+ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?"
            r"(\w+)",
            st.sql,
            re.I,
        ):
            columns.setdefault(m.group(1).lower(), set()).add(m.group(2).lower())
    return Schema({t: frozenset(c) for t, c in columns.items()}, keys)


def key_violations(schema: Schema) -> list[str]:
    """Rule 1: unique keys of sharded tables without the distribution column."""
    sharded = schema.sharded()
    return [
        f"{origin}: unique key {cols} of {table} lacks {SHARD_KEY}"
        for origin, table, cols in schema.keys
        if table in sharded and SHARD_KEY not in cols
    ]


_REFERENCE = re.compile(r"\b(FROM|JOIN|UPDATE|INTO|USING)\s+(\w+)(?:\s+(?:AS\s+)?(\w+))?", re.I)


@dataclass(frozen=True)
class Reference:
    verb: str  # FROM, JOIN, UPDATE, INTO, USING
    table: str
    alias: str  # the table's name when it has no alias


def references(sql: str, tables: frozenset[str]) -> list[Reference]:
    found = []
    for m in _REFERENCE.finditer(sql):
        table = m.group(2).lower()
        if table not in tables:
            continue
        alias = m.group(3)
        if alias is None or alias.lower() in _KEYWORDS:
            alias = table
        found.append(Reference(m.group(1).upper(), table, alias.lower()))
    # "DELETE FROM t" and "INSERT INTO t" are writes, "UPDATE t" too.
    return found


def keyed(sql: str, ref: Reference) -> bool:
    """The reference is bound to one key: ``alias.webhook_id = $n`` (or unqualified, for an
    unaliased reference); an INSERT's rows come from parameters, not from unnest()."""
    if ref.verb == "INTO":
        return re.search(r"\bunnest\s*\(", sql, re.I) is None
    if ref.alias == ref.table:
        pattern = rf"(?<![\w.])(?:{ref.table}\.)?{SHARD_KEY}\s*=\s*\$\d+"
    else:
        pattern = rf"\b{ref.alias}\.{SHARD_KEY}\s*=\s*\$\d+"
    return re.search(pattern, sql, re.I) is not None


def _is_write(sql: str, ref: Reference) -> bool:
    if ref.verb in ("UPDATE", "INTO"):
        return True
    deletes = re.search(rf"\bDELETE\s+FROM\s+{ref.table}\b", sql, re.I)
    return ref.verb == "FROM" and deletes is not None


def unkeyed_writes(statements: list[Statement], sharded: frozenset[str]) -> set[str]:
    """Rule 2: statements that write to a sharded table without binding one key."""
    return {
        st.name
        for st in statements
        for ref in references(st.sql, sharded)
        if _is_write(st.sql, ref) and not keyed(st.sql, ref)
    }


def unkeyed_reads(statements: list[Statement], sharded: frozenset[str]) -> set[tuple[str, str]]:
    """Rule 3: hot-path table references not bound to one key, as (statement, alias)."""
    return {
        (st.name, ref.alias)
        for st in statements
        if st.name in HOT_PATH and st.name not in MULTI_SHARD_WRITES
        for ref in references(st.sql, sharded)
        if not _is_write(st.sql, ref) and not keyed(st.sql, ref)
    }


def session_features(statements: list[Statement]) -> set[tuple[str, str]]:
    """Rule 4: where LISTEN/NOTIFY and advisory locks appear, as (statement, feature)."""
    return {
        (st.name, feature)
        for st in statements
        for feature, pattern in _FEATURES.items()
        if pattern.search(st.sql)
    }


def unportable(statements: list[Statement]) -> list[str]:
    """Rule 5: constructs no sharded engine offers."""
    return [
        f"{st.origin}: {what}"
        for st in statements
        for what, pattern in _UNPORTABLE.items()
        if pattern.search(st.sql)
    ]


@pytest.fixture(scope="module")
def named() -> list[Statement]:
    return list(named_statements())


@pytest.fixture(scope="module")
def schema() -> Schema:
    return read_schema(list(schema_statements()))


def test_the_ledger_tables_are_sharded_by_the_key(schema: Schema) -> None:
    assert {"receiver_receipts", "receiver_attempts"} <= schema.sharded()
    assert set(UNSHARDED) <= set(schema.columns), "an exception names a table that is gone"


def test_every_unique_key_of_a_sharded_table_contains_the_distribution_column(
    schema: Schema,
) -> None:
    assert key_violations(schema) == []


def test_every_write_targets_one_key_or_is_a_listed_multi_shard_statement(
    named: list[Statement], schema: Schema
) -> None:
    found = unkeyed_writes(named, schema.sharded())
    assert found - set(MULTI_SHARD_WRITES) == set(), "unkeyed writes: list them with a fallback"
    assert set(MULTI_SHARD_WRITES) - found == set(), "listed, but now keyed: drop the entry"


def test_the_hot_path_reads_one_key_or_is_a_listed_exception(
    named: list[Statement], schema: Schema
) -> None:
    assert {st.name for st in named} >= HOT_PATH, "a hot-path statement is gone"
    found = unkeyed_reads(named, schema.sharded())
    assert found - set(HOT_PATH_CROSS_SHARD) == set(), "cross-shard reads on the hot path"
    assert set(HOT_PATH_CROSS_SHARD) - found == set(), "listed, but now keyed: drop the entry"


def test_listen_notify_and_advisory_locks_only_where_a_fallback_exists(
    named: list[Statement], schema: Schema
) -> None:
    found = session_features([*named, *schema_statements()])
    assert found - set(SESSION_FEATURES) == set(), "a session feature without a fallback"
    assert set(SESSION_FEATURES) - found == set(), "listed, but no longer used: drop the entry"


def test_nothing_that_no_sharded_engine_offers(named: list[Statement]) -> None:
    assert unportable([*named, *schema_statements()]) == []


# The checker itself: each rule catches a statement that breaks it.


def _one(sql: str, name: str = "probe") -> list[Statement]:
    return [Statement(name, name, _strip_comments(sql))]


def test_the_checker_catches_a_unique_key_without_the_distribution_column() -> None:
    bad = read_schema(
        _one(
            "CREATE TABLE receiver_receipts (provider text, webhook_id text, payload_hash bytea,"
            " PRIMARY KEY (provider, webhook_id));"
            "CREATE UNIQUE INDEX by_hash ON receiver_receipts (provider, payload_hash)"
        )
        + _one("ALTER TABLE receiver_receipts ADD CONSTRAINT h UNIQUE (payload_hash)")
        + _one("ALTER TABLE receiver_receipts ADD COLUMN seq bigint UNIQUE")
    )
    assert len(key_violations(bad)) == 3
    good = read_schema(_one("CREATE TABLE t (webhook_id text PRIMARY KEY)"))
    assert key_violations(good) == []


def test_the_checker_catches_unkeyed_writes_and_reads() -> None:
    sharded = frozenset({"receiver_receipts"})
    writes = _one("UPDATE receiver_receipts SET state = 'failed' WHERE provider = $1")
    writes += _one("DELETE FROM receiver_receipts WHERE expires_at < now()", "sweep")
    writes += _one("INSERT INTO receiver_receipts SELECT * FROM unnest($1::text[])", "bulk")
    writes += _one("UPDATE receiver_receipts SET fence = 2 WHERE webhook_id = $2", "keyed")
    assert unkeyed_writes(writes, sharded) == {"probe", "sweep", "bulk"}
    reads = _one(
        "SELECT 1 FROM receiver_receipts r JOIN receiver_receipts d ON d.payload_hash = $3 "
        "WHERE r.webhook_id = $2",
        "claim",
    )
    assert unkeyed_reads(reads, sharded) == {("claim", "d")}


def test_the_checker_catches_session_features_and_unportable_constructs() -> None:
    st = _one("SELECT pg_advisory_lock(1)", "a") + _one("LISTEN x", "b")
    st += _one("SELECT ctid FROM t", "c") + _one("SET search_path = x", "d")
    assert session_features(st) == {("b", "pg_notify"), ("a", "advisory")}
    assert {u.split(": ")[1] for u in unportable(st)} == {"ctid", "session SET"}
    assert unportable(_one("SET LOCAL lock_timeout = '5s'")) == []
