"""``python -m benchmarks.retention --rows 10000000``: what expiring one day of receipts costs,
today's table against a time-partitioned prototype and the shipped partitioned layout, on
receipts generated in SQL.

The sides live in one scratch database (``--pg-url``, dropped and created again; default
``receiver_retention_bench``) and are filled in the same run, chunk by chunk, alternating, so
that a busy machine slows them alike.

* **today**: ``receiver_receipts`` exactly as ``schema.sql`` creates it (primary key
  ``(provider, webhook_id)`` and every secondary index), swept by the ledger's own
  ``delete_expired`` statement in batches of ``DELETE_BATCH`` rows, then ``VACUUM``.
* **partitioned**: a narrow key table ``bench_keys (provider, webhook_id, bucket)`` holds the
  global unique key; the receipts' other columns live in ``bench_bodies``, partitioned by range
  on ``bucket`` (the claim's day), with the same secondary indexes. Expiring a day: the dead
  letters of that day (kept for their retention) are moved to a ``kept`` partition, the day's
  keys are deleted from the key table (one statement, row by row: the unique key stays global,
  so its entries must go one by one; found by a BRIN index on the day, in the order they lie
  on disk), the day's partition is detached and dropped, then ``VACUUM`` of the key table.
* **shipped**: the product's own partitioned layout (``receiver migrate --layout partitioned``,
  receiver/_store/partitions.py), in a schema of its own (``shipped``: its tables have the
  same names as today's): the migrations applied by ``PostgresStore.migrate``, converted by
  ``partitions.convert``, one partition opened per generated day by
  ``partitions.open_partition``. The load appends each day's receipts to that day's partition
  and their keys to ``receiver_receipt_keys`` (what the claim trigger would have written, with
  triggers off for the load, as a restore does); the hot path goes through the parent table
  (claims through the trigger, completions by key without the bucket, probing every
  partition); the sweep is ``partitions.expire`` itself, then ``VACUUM`` of the key table.

The receipts: ``--days`` days of traffic spread evenly, four providers, 99% completed (no
request body: completion drops it, as the ledger does; a ~60-byte JSON answer), 1% failed
(a 1 KB request body and an error, kept as dead letters). The sweep expires the oldest day's
completed receipts. Reported per side: fill rate (rows/s, bulk INSERT ... SELECT), table and
index size, the sweep's time and WAL, VACUUM's time and WAL, sizes after, and the hot path
(claim then fenced completion, one receipt at a time, server-side in PL/pgSQL so that round
trips do not hide the difference) on the filled tables.

Writes ``benchmarks/results/retention.json``. Never asserts timings; not run by the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import asyncpg

from receiver._ops.sweeper import DELETE_BATCH
from receiver._store import partitions
from receiver._store.postgres import PostgresStore
from receiver._store.queries import queries

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0
#: The first generated day starts here (unix seconds: a midnight UTC, so that days are partitions).
BASE = 1_699_920_000.0

# One generated receipt per g in the series, the same g on both sides. The day of g is
# floor(g / per_day); claims are spread evenly within it.
_COLUMNS = """
    (ARRAY['stripe', 'github', 'shopify', 'slack'])[1 + g % 4] AS provider,
    'evt_' || substr(md5(g::text), 1, 24) AS webhook_id,
    sha256(int8send(g)) AS payload_hash,
    CASE WHEN g % 100 = 0 THEN 'failed' ELSE 'completed' END AS state,
    1::bigint AS fence,
    'invoice.paid' AS event_type,
    to_timestamp($3::float8 + g::float8 * 86400.0 / $4::float8) AS claimed_at,
    to_timestamp($3::float8 + g::float8 * 86400.0 / $4::float8 + 30) AS lease_until,
    to_timestamp($3::float8 + g::float8 * 86400.0 / $4::float8 + 86400) AS expires_at,
    to_timestamp($3::float8 + g::float8 * 86400.0 / $4::float8 + 0.05) AS completed_at,
    CASE WHEN g % 100 = 0 THEN NULL ELSE 200 END AS response_status,
    CASE WHEN g % 100 = 0 THEN NULL ELSE 'application/json' END AS response_content_type,
    CASE WHEN g % 100 = 0 THEN NULL
         ELSE convert_to('{"ok":true,"id":"' || md5(g::text) || '"}', 'UTF8') END
        AS response_body,
    CASE WHEN g % 100 = 0 THEN convert_to(repeat(md5(g::text), 32), 'UTF8') END
        AS request_body,
    CASE WHEN g % 100 = 0 THEN 5 ELSE 0 END AS attempts,
    CASE WHEN g % 100 = 0 THEN 'HTTPStatusError: 500' END AS last_error
"""
_NAMES = (
    "provider, webhook_id, payload_hash, state, fence, event_type, claimed_at, lease_until, "
    "expires_at, completed_at, response_status, response_content_type, response_body, "
    "request_body, attempts, last_error"
)

_PARTITIONED = """
CREATE TABLE bench_keys (
    provider   text NOT NULL,
    webhook_id text NOT NULL,
    bucket     date NOT NULL,
    PRIMARY KEY (provider, webhook_id)
);
-- Keys are appended in claim order, so a day's keys lie together on disk: a BRIN index (a few
-- pages) finds them, and the sweep deletes them in the order they lie instead of the random
-- order of the primary key, which would write each page's full image again after every
-- checkpoint (a hundred million keys: 46 GB of WAL to delete one day's).
CREATE INDEX bench_keys_bucket ON bench_keys USING brin (bucket);
CREATE TABLE bench_bodies (
    provider              text        NOT NULL,
    webhook_id            text        NOT NULL,
    bucket                date        NOT NULL,
    payload_hash          bytea       NOT NULL,
    state                 text        NOT NULL,
    fence                 bigint      NOT NULL DEFAULT 1,
    event_type            text,
    claimed_at            timestamptz NOT NULL,
    lease_until           timestamptz NOT NULL,
    expires_at            timestamptz NOT NULL,
    completed_at          timestamptz,
    response_status       integer,
    response_content_type text,
    response_body         bytea,
    request_body          bytea,
    attempts              integer     NOT NULL DEFAULT 0,
    last_error            text,
    response_headers      bytea,
    due_at                timestamptz,
    PRIMARY KEY (provider, webhook_id, bucket)
) PARTITION BY RANGE (bucket);
CREATE TABLE bench_bodies_kept PARTITION OF bench_bodies
    FOR VALUES FROM ('9999-01-01') TO ('9999-12-31');
CREATE INDEX ON bench_bodies (expires_at) WHERE state = 'completed' AND expires_at < 'infinity';
CREATE INDEX ON bench_bodies (expires_at)
    WHERE state IN ('failed', 'released') AND expires_at < 'infinity';
CREATE INDEX ON bench_bodies (lease_until) WHERE state = 'in_flight';
CREATE INDEX ON bench_bodies (due_at) WHERE state = 'queued';
CREATE INDEX ON bench_bodies (provider, state, webhook_id) WHERE state IN ('released', 'failed');
CREATE INDEX ON bench_bodies (payload_hash, provider);
CREATE INDEX ON bench_bodies (provider COLLATE "C", claimed_at);
"""

# The hot path, one receipt at a time, as the ledger runs it (claim: INSERT ... ON CONFLICT DO
# NOTHING; completion: the fenced UPDATE by key). The partitioned claim is one statement too:
# the key's insert feeds the body's.
_HOT_TODAY = """
DO $$
DECLARE i int; f bigint;
BEGIN
  FOR i IN 1..%(n)s LOOP
    INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state, fence, event_type,
        claimed_at, lease_until, expires_at, request_body)
    VALUES ('stripe', 'hot_%(tag)s_' || i, sha256(int4send(i)), 'in_flight', 1, 'invoice.paid',
        now(), now() + interval '30 s', now() + interval '1 day', '\\x00'::bytea)
    ON CONFLICT (provider, webhook_id) DO NOTHING
    RETURNING fence INTO f;
    UPDATE receiver_receipts SET state = 'completed', response_status = 200,
        response_content_type = 'application/json', response_body = '\\x7b7d'::bytea,
        completed_at = now(), request_body = NULL
    WHERE provider = 'stripe' AND webhook_id = 'hot_%(tag)s_' || i AND fence = f
      AND state COLLATE "C" = 'in_flight';
  END LOOP;
END $$;
"""
_HOT_PARTITIONED = """
DO $$
DECLARE i int; b date;
BEGIN
  FOR i IN 1..%(n)s LOOP
    WITH k AS (
        INSERT INTO bench_keys (provider, webhook_id, bucket)
        VALUES ('stripe', 'hot_%(tag)s_' || i, %(bucket)s)
        ON CONFLICT (provider, webhook_id) DO NOTHING
        RETURNING provider, webhook_id, bucket
    )
    INSERT INTO bench_bodies (provider, webhook_id, bucket, payload_hash, state, fence,
        event_type, claimed_at, lease_until, expires_at, request_body)
    SELECT k.provider, k.webhook_id, k.bucket, sha256(int4send(i)), 'in_flight', 1,
        'invoice.paid', now(), now() + interval '30 s', now() + interval '1 day', '\\x00'::bytea
    FROM k
    RETURNING bucket INTO b;
    UPDATE bench_bodies SET state = 'completed', response_status = 200,
        response_content_type = 'application/json', response_body = '\\x7b7d'::bytea,
        completed_at = now(), request_body = NULL
    WHERE provider = 'stripe' AND webhook_id = 'hot_%(tag)s_' || i AND bucket = b
      AND fence = 1 AND state COLLATE "C" = 'in_flight';
  END LOOP;
END $$;
"""
# The shipped layout's hot path: the ledger's claim (ON CONFLICT without an arbiter: the key
# table's trigger skips a key already there) and its complete statement, by key and fence
# without the bucket, as the ledger sends them (the search path is the shipped schema).
_HOT_SHIPPED = _HOT_TODAY.replace(
    "ON CONFLICT (provider, webhook_id) DO NOTHING", "ON CONFLICT DO NOTHING"
)

SIDES = ("today", "partitioned", "shipped")
#: The schema of the shipped side: its tables are named as today's.
SHIPPED = "shipped"
#: What each side measures: its tables, the partitioned parent last.
_TABLES = {
    "today": ["receiver_receipts"],
    "partitioned": ["bench_keys", "bench_bodies"],
    "shipped": [f"{SHIPPED}.receiver_receipt_keys", f"{SHIPPED}.receiver_receipts"],
}
#: Each side's receipts (its partitioned parent, if any).
_RECEIPTS = {
    "today": "receiver_receipts",
    "partitioned": "bench_bodies",
    "shipped": f"{SHIPPED}.receiver_receipts",
}
#: Dead letters are kept this long past their window (the sweep's retention on every side).
RETENTION = 7 * DAY


def _day(n: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(BASE + n * DAY))


async def _wal(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def _timed(conn: asyncpg.Connection, sql: str, *args: Any) -> tuple[float, int]:
    """Seconds and WAL bytes of one statement."""
    wal = await _wal(conn)
    started = time.perf_counter()
    await conn.execute(sql, *args)
    return time.perf_counter() - started, await _wal(conn) - wal


async def _sizes(conn: asyncpg.Connection, tables: list[str]) -> dict[str, int]:
    heap = index = toast = 0
    for table in tables:
        row = await conn.fetchrow(
            "SELECT coalesce(sum(pg_relation_size(c.oid)), 0)::bigint AS heap,"
            " coalesce(sum(pg_indexes_size(c.oid)), 0)::bigint AS index,"
            " coalesce(sum(pg_total_relation_size(c.oid) - pg_relation_size(c.oid)"
            "  - pg_indexes_size(c.oid)), 0)::bigint AS toast"
            " FROM pg_class c WHERE c.oid = $1::regclass"
            " OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)",
            table,
        )
        heap += row["heap"]
        index += row["index"]
        toast += row["toast"]
    return {"heap": heap, "indexes": index, "toast": toast, "total": heap + index + toast}


async def _fill(
    conn: asyncpg.Connection,
    sides: tuple[str, ...],
    rows: int,
    days: int,
    chunk: int,
    buckets: list[int],
) -> dict[str, Any]:
    """``buckets``: the shipped side's partition of each day."""
    per_day = rows // days
    if "partitioned" in sides:
        for d in range(days):
            await conn.execute(
                f"CREATE TABLE bench_bodies_{d} PARTITION OF bench_bodies"
                f" FOR VALUES FROM ('{_day(d)}') TO ('{_day(d + 1)}')"
            )
            await conn.execute(f"ALTER TABLE bench_bodies_{d} SET (autovacuum_enabled = off)")
    today_sql = (
        f"INSERT INTO receiver_receipts ({_NAMES}) SELECT {_COLUMNS}"  # noqa: S608
        " FROM generate_series($1::bigint, $2::bigint) AS g"
    )
    keys_sql = (
        "INSERT INTO bench_keys (provider, webhook_id, bucket)"
        " SELECT (ARRAY['stripe', 'github', 'shopify', 'slack'])[1 + g % 4],"
        " 'evt_' || substr(md5(g::text), 1, 24),"
        " (to_timestamp($3::float8 + g::float8 * 86400.0 / $4::float8) AT TIME ZONE 'UTC')::date"
        " FROM generate_series($1::bigint, $2::bigint) AS g"
    )
    bodies_sql = (
        f"INSERT INTO bench_bodies (bucket, {_NAMES}) SELECT"  # noqa: S608
        " (to_timestamp($3::float8 + g::float8 * 86400.0 / $4::float8) AT TIME ZONE 'UTC')::date,"
        f" {_COLUMNS} FROM generate_series($1::bigint, $2::bigint) AS g"
    )
    # The shipped side: each day's receipts straight into that day's partition, their keys
    # into the key table (the rows the claim trigger would have written; triggers are off for
    # the load, as in a restore, else the trigger cloned on each partition runs row by row).
    shipped_keys_sql = (
        f"INSERT INTO {SHIPPED}.receiver_receipt_keys (provider, webhook_id, bucket)"  # noqa: S608
        " SELECT (ARRAY['stripe', 'github', 'shopify', 'slack'])[1 + g % 4],"
        " 'evt_' || substr(md5(g::text), 1, 24), $3::bigint"
        " FROM generate_series($1::bigint, $2::bigint) AS g"
    )
    shipped_sql = (
        f"(bucket, {_NAMES}) SELECT $5::bigint, {_COLUMNS}"  # noqa: S608
        " FROM generate_series($1::bigint, $2::bigint) AS g"
    )
    spent = dict.fromkeys(sides, 0.0)
    total = per_day * days
    for start in range(0, total, chunk):
        end = min(start + chunk, total) - 1
        args = (start, end, BASE, float(per_day))
        line = f"  filled {end + 1:>11,} / {total:,}"
        for side in sides:
            started = time.perf_counter()
            if side == "today":
                await conn.execute(today_sql, *args)
            elif side == "shipped":
                async with conn.transaction():
                    await conn.execute("SET LOCAL session_replication_role = replica")
                    # The chunk's days, each into its own partition.
                    for d in range(start // per_day, end // per_day + 1):
                        lo, hi = max(start, d * per_day), min(end, (d + 1) * per_day - 1)
                        part = f"{SHIPPED}.receiver_receipts_p{buckets[d]}"
                        day_args = (lo, hi, BASE, float(per_day), buckets[d])
                        await conn.execute(shipped_keys_sql, lo, hi, buckets[d])
                        await conn.execute(f"INSERT INTO {part} {shipped_sql}", *day_args)
            else:
                async with conn.transaction():
                    await conn.execute(keys_sql, *args)
                    await conn.execute(bodies_sql, *args)
            spent[side] += time.perf_counter() - started
            line += f"  {side} {time.perf_counter() - started:6.1f} s"
        print(line, flush=True)
    return (
        {"rows": total, "per_day": per_day}
        | {f"{side}_rows_per_s": total / spent[side] for side in sides}
        | {f"{side}_insert_s": spent[side] for side in sides}
    )


async def _defer_indexes(conn: asyncpg.Connection, tables: list[str]) -> list[str]:
    """Drop the tables' primary keys and indexes before a bulk load, returning the statements
    that build them again (as a restore does: the load appends to bare heaps, and each index
    is built once by a sort instead of row by row)."""
    rebuild: list[str] = []
    for table in tables:
        for name, definition in await conn.fetch(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = $1::regclass AND contype = 'p'",
            table,
        ):
            await conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            rebuild.append(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        for name, definition in await conn.fetch(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indrelid = $1::regclass",
            table,
        ):
            await conn.execute(f"DROP INDEX {name}")
            # A partitioned table's index reads "ON ONLY" (the parent alone, its partitions'
            # indexes attached one by one); without it the statement builds every partition's.
            rebuild.append(definition.replace(" ON ONLY ", " ON ", 1))
    return rebuild


async def _partitions_of(conn: asyncpg.Connection, table: str) -> list[str]:
    return [
        row[0]
        for row in await conn.fetch(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1::regclass"
            " ORDER BY inhrelid",
            table,
        )
    ]


async def _build_indexes(conn: asyncpg.Connection, statements: list[str]) -> float:
    started = time.perf_counter()
    for statement in statements:
        step = time.perf_counter()
        await conn.execute(statement)
        print(f"  built in {time.perf_counter() - step:6.1f} s: {statement[:90]}", flush=True)
    return time.perf_counter() - started


async def _hot(
    conns: dict[str, asyncpg.Connection], sides: tuple[str, ...], n: int, rounds: int, day: int
) -> dict[str, list[float]]:
    """Claim + completion, one receipt at a time, interleaved rounds per side (receipts/s),
    into the newest day (the partition claims go to); each side on its connection (the
    shipped side's searches its schema)."""
    out: dict[str, list[float]] = {side: [] for side in sides}
    bucket = f"'{_day(day)}'::date"
    templates = {"today": _HOT_TODAY, "partitioned": _HOT_PARTITIONED, "shipped": _HOT_SHIPPED}
    for r in range(rounds):
        for side in sides:
            sql = templates[side] % {"n": n, "tag": f"{side}{r}", "bucket": bucket}
            started = time.perf_counter()
            await conns[side].execute(sql)
            out[side].append(n / (time.perf_counter() - started))
    # The hot rows are not generated receipts: take them out again before the sweep (the
    # shipped receipts' delete trigger gives their keys back).
    for side in sides:
        for table in reversed(_TABLES[side]):
            await conns[side].execute(
                f"DELETE FROM {table} WHERE webhook_id LIKE 'hot\\_%'"  # noqa: S608
            )
        for table in _TABLES[side]:
            await conns[side].execute(f"VACUUM {table}")
    return out


async def _sweep_today(conn: asyncpg.Connection, now: float) -> dict[str, Any]:
    statement = queries("postgresql")["delete_expired"]
    wal = await _wal(conn)
    started = time.perf_counter()
    deleted = batches = 0
    while True:
        n = await conn.fetchval(statement, now, RETENTION, DELETE_BATCH)
        deleted += n
        batches += 1
        if n < DELETE_BATCH:
            break
    sweep = time.perf_counter() - started
    sweep_wal = await _wal(conn) - wal
    vacuum, vacuum_wal = await _timed(conn, "VACUUM receiver_receipts")
    return {
        "deleted": deleted,
        "batches": batches,
        "sweep_s": sweep,
        "sweep_wal": sweep_wal,
        "vacuum_s": vacuum,
        "vacuum_wal": vacuum_wal,
    }


async def _sweep_partitioned(conn: asyncpg.Connection) -> dict[str, Any]:
    wal = await _wal(conn)
    started = time.perf_counter()
    # Dead letters stay for their retention: out of the day, into the kept partition.
    moved = await conn.fetchval(
        "WITH m AS (UPDATE bench_bodies SET bucket = '9999-06-01'"  # noqa: S608
        f" WHERE bucket >= '{_day(0)}' AND bucket < '{_day(1)}' AND state <> 'completed'"
        " RETURNING 1) SELECT count(*) FROM m"
    )
    await conn.execute(
        "UPDATE bench_keys SET bucket = '9999-06-01' WHERE (provider, webhook_id) IN"
        " (SELECT provider, webhook_id FROM bench_bodies_kept)"
    )
    move = time.perf_counter() - started
    deleted = await conn.fetchval(
        "WITH d AS (DELETE FROM bench_keys"  # noqa: S608
        f" WHERE bucket >= '{_day(0)}' AND bucket < '{_day(1)}' RETURNING 1)"
        " SELECT count(*) FROM d"
    )
    keys = time.perf_counter() - started - move
    drop_started = time.perf_counter()
    await conn.execute("ALTER TABLE bench_bodies DETACH PARTITION bench_bodies_0")
    await conn.execute("DROP TABLE bench_bodies_0")
    drop = time.perf_counter() - drop_started
    sweep = time.perf_counter() - started
    sweep_wal = await _wal(conn) - wal
    vacuum, vacuum_wal = await _timed(conn, "VACUUM bench_keys")
    v2, w2 = await _timed(conn, "VACUUM bench_bodies_kept")
    return {
        "deleted": deleted,
        "moved_dead_letters": moved,
        "move_s": move,
        "keys_delete_s": keys,
        "drop_s": drop,
        "sweep_s": sweep,
        "sweep_wal": sweep_wal,
        "vacuum_s": vacuum + v2,
        "vacuum_wal": vacuum_wal + w2,
    }


async def _sweep_shipped(
    store: PostgresStore, conn: asyncpg.Connection, now: float, bucket: int
) -> dict[str, Any]:
    """The product's own sweep, ``partitions.expire``: partition ``bucket`` (the oldest day)
    is the one it must drop; its dead letters move to the current partition."""
    part = f"{SHIPPED}.receiver_receipts_p{bucket}"
    kept = await conn.fetchval(
        f"SELECT count(*) FROM {part} WHERE state <> 'completed'"  # noqa: S608
    )
    before = await conn.fetchval(f"SELECT count(*) FROM {SHIPPED}.receiver_partitions")  # noqa: S608
    wal = await _wal(conn)
    started = time.perf_counter()
    deleted = await partitions.expire(store, now, RETENTION, time.monotonic() + 3600)
    sweep = time.perf_counter() - started
    sweep_wal = await _wal(conn) - wal
    after = await conn.fetchval(f"SELECT count(*) FROM {SHIPPED}.receiver_partitions")  # noqa: S608
    gone = await conn.fetchval("SELECT to_regclass($1) IS NULL", part)
    current = (await _partitions_of(conn, f"{SHIPPED}.receiver_receipts"))[-1]
    vacuum, vacuum_wal = await _timed(conn, f"VACUUM {SHIPPED}.receiver_receipt_keys")
    v2, w2 = await _timed(conn, f"VACUUM {current}")
    return {
        "deleted": deleted,
        "moved_dead_letters": kept,
        "partitions_dropped": before - after,
        "oldest_dropped": gone,
        "sweep_s": sweep,
        "sweep_wal": sweep_wal,
        "vacuum_s": vacuum + v2,
        "vacuum_wal": vacuum_wal + w2,
    }


async def _check(conn: asyncpg.Connection, sides: tuple[str, ...], expected: int) -> dict[str, Any]:
    """Each side must end holding the receipts it should (the generated ones less the expired
    day's completed ones), every body with its key and every key with its body; with both sides
    in the database, the same receipts: a side that deleted more (or less) would have been
    measured doing other work."""
    out: dict[str, Any] = {"expected_rows": expected}
    ok = True
    if "today" in sides:
        out["today_rows"] = await conn.fetchval("SELECT count(*) FROM receiver_receipts")
        ok = ok and out["today_rows"] == expected
    if "partitioned" in sides:
        out["partitioned_rows"] = await conn.fetchval("SELECT count(*) FROM bench_bodies")
        out["keys"] = await conn.fetchval("SELECT count(*) FROM bench_keys")
        out["keys_without_body"] = await conn.fetchval(
            "SELECT count(*) FROM bench_keys k WHERE NOT EXISTS (SELECT 1 FROM bench_bodies b"
            " WHERE b.provider = k.provider AND b.webhook_id = k.webhook_id"
            " AND b.bucket = k.bucket)"
        )
        # Each partition must carry every index of the table, or the side measured less work.
        out["partitions_missing_indexes"] = await conn.fetchval(
            "SELECT count(*) FROM pg_inherits i WHERE i.inhparent = 'bench_bodies'::regclass"
            " AND (SELECT count(*) FROM pg_index WHERE indrelid = i.inhrelid)"
            " <> (SELECT count(*) FROM pg_index WHERE indrelid = 'bench_bodies'::regclass)"
        )
        ok = (
            ok
            and out["partitioned_rows"] == out["keys"] == expected
            and out["keys_without_body"] == 0
            and out["partitions_missing_indexes"] == 0
        )
    if "shipped" in sides:
        receipts, keys = f"{SHIPPED}.receiver_receipts", f"{SHIPPED}.receiver_receipt_keys"
        out["shipped_rows"] = await conn.fetchval(f"SELECT count(*) FROM {receipts}")  # noqa: S608
        out["shipped_keys"] = await conn.fetchval(f"SELECT count(*) FROM {keys}")  # noqa: S608
        out["shipped_keys_without_body"] = await conn.fetchval(
            f"SELECT count(*) FROM {keys} k WHERE NOT EXISTS (SELECT 1 FROM {receipts} b"  # noqa: S608
            " WHERE b.provider = k.provider AND b.webhook_id = k.webhook_id"
            " AND b.bucket = k.bucket)"
        )
        # Each partition must have its primary key and every index of the parent attached.
        out["shipped_partitions_missing_indexes"] = await conn.fetchval(
            "SELECT count(*) FROM pg_inherits i WHERE i.inhparent = $1::regclass"
            " AND ((SELECT count(*) FROM pg_index x JOIN pg_inherits a"
            "       ON a.inhrelid = x.indexrelid WHERE x.indrelid = i.inhrelid)"
            "      <> (SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass)"
            "  OR NOT EXISTS (SELECT 1 FROM pg_constraint"
            "                 WHERE conrelid = i.inhrelid AND contype = 'p'))",
            receipts,
        )
        ok = (
            ok
            and out["shipped_rows"] == out["shipped_keys"] == expected
            and out["shipped_keys_without_body"] == 0
            and out["shipped_partitions_missing_indexes"] == 0
        )
    # With several sides in the database, the same receipts on each as on the first.
    for other in sides[1:]:
        key = (
            f"only_in_{sides[0]}"
            if (sides[0], other) == ("today", "partitioned")
            else f"only_in_{sides[0]}_not_{other}"
        )
        out[key] = await conn.fetchval(
            "SELECT count(*) FROM (SELECT provider, webhook_id, state"  # noqa: S608
            f" FROM {_RECEIPTS[sides[0]]} EXCEPT SELECT provider, webhook_id, state"
            f" FROM {_RECEIPTS[other]}) AS d"
        )
        ok = ok and out[key] == 0
    out["ok"] = ok
    return out


async def _machine(conn: asyncpg.Connection) -> dict[str, Any]:
    """What the figures were measured on: the cores, the memory, and the server's version and
    the settings that bound what stays in memory and how often it checkpoints."""
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(pages * page_size / 1e9, 1),
        "postgresql": await conn.fetchval("SHOW server_version"),
        "shared_buffers": await conn.fetchval("SHOW shared_buffers"),
        "max_wal_size": await conn.fetchval("SHOW max_wal_size"),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sides = tuple(side for side in SIDES if side in args.sides)
    tables = [table for side in sides for table in _TABLES[side]]
    admin = await asyncpg.connect(args.pg_url.rsplit("/", 1)[0] + "/postgres")
    name = args.pg_url.rsplit("/", 1)[1]
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(args.pg_url, command_timeout=None)
    conns = dict.fromkeys(sides, conn)
    store: PostgresStore | None = None
    pool: asyncpg.Pool | None = None
    buckets: list[int] = []
    result: dict[str, Any] = {"machine": await _machine(conn), "args": vars(args)}
    try:
        if "today" in sides:
            await conn.execute((ROOT / "schema.sql").read_text())
        if "partitioned" in sides:
            await conn.execute(_PARTITIONED)
        if "shipped" in sides:
            # The product's way, in a schema of its own: the migrations, the conversion, then
            # a partition per generated day, opened at the day's start.
            await conn.execute(f"CREATE SCHEMA {SHIPPED}")
            settings = {"search_path": SHIPPED}
            pool = await asyncpg.create_pool(
                args.pg_url, min_size=0, max_size=2, server_settings=settings
            )
            store = PostgresStore(pool=pool)
            conns["shipped"] = await asyncpg.connect(
                args.pg_url, command_timeout=None, server_settings=settings
            )
            await store.migrate()
            async with store.acquire() as sconn:
                await partitions.convert(sconn, "partitioned")
            for d in range(args.days):
                buckets.append(await partitions.open_partition(store, BASE + d * DAY))
            for part in await _partitions_of(conn, f"{SHIPPED}.receiver_receipts"):
                await conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = off)")
        # Autovacuum would run at its own moments on one side or the other: off for both, and
        # every VACUUM here is explicit and timed.
        for table in tables:
            # Partitioned tables: their partitions are set as they are created.
            if table not in ("bench_bodies", f"{SHIPPED}.receiver_receipts"):
                await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        rebuild: dict[str, list[str]] = {side: [] for side in sides}
        if args.defer_indexes:
            for side in sides:
                load = list(_TABLES[side])
                if side == "shipped":  # and each partition's own primary key
                    load += await _partitions_of(conn, f"{SHIPPED}.receiver_receipts")
                rebuild[side] = await _defer_indexes(conn, load)
        print(f"fill {', '.join(sides)}: {args.rows:,} receipts over {args.days} days", flush=True)
        result["fill"] = await _fill(conn, sides, args.rows, args.days, args.chunk, buckets)
        # As a restore would: memory enough to sort each index in a few runs.
        await conn.execute("SET maintenance_work_mem = '1GB'")
        for side in sides:
            vacuum = 0.0
            for table in _TABLES[side]:
                vacuum += (await _timed(conn, f"VACUUM (ANALYZE) {table}"))[0]
            result["fill"][f"{side}_vacuum_s"] = vacuum
            if rebuild[side]:
                result["fill"][f"{side}_index_build_s"] = await _build_indexes(conn, rebuild[side])
                for table in _TABLES[side]:
                    await conn.execute(f"ANALYZE {table}")
        await conn.execute("RESET maintenance_work_mem")
        print("fill:", result["fill"], flush=True)
        if store is not None:
            # The partitions the conversion left (the former table, 0, and the one it opened,
            # 1), empty: the product's sweep drops them, at a time when every day's completed
            # receipts are still within their window, so that the measured sweep drops one.
            await partitions.expire(store, BASE, RETENTION, time.monotonic() + 600)
            result["fill"]["shipped_partitions"] = len(
                await _partitions_of(conn, f"{SHIPPED}.receiver_receipts")
            )
        await conn.execute("CHECKPOINT")
        result["size_before"] = {side: await _sizes(conn, _TABLES[side]) for side in sides}
        print("sizes:", result["size_before"], flush=True)
        result["hot_path_per_s"] = await _hot(
            conns, sides, args.hot, args.hot_rounds, args.days - 1
        )
        print("hot path:", result["hot_path_per_s"], flush=True)
        # Expire day 0's completed receipts: "now" is the end of their window.
        now = BASE + 2 * DAY - 0.001
        result["sweep"] = {}
        for side in sides:
            await conn.execute("CHECKPOINT")
            if side == "today":
                result["sweep"][side] = await _sweep_today(conn, now)
            elif side == "shipped":
                assert store is not None
                result["sweep"][side] = await _sweep_shipped(store, conn, now, buckets[0])
            else:
                result["sweep"][side] = await _sweep_partitioned(conn)
            print(f"sweep {side}:", result["sweep"][side], flush=True)
        result["size_after"] = {side: await _sizes(conn, _TABLES[side]) for side in sides}
        print("sizes after:", result["size_after"], flush=True)
        expired = result["fill"]["per_day"] - -(-result["fill"]["per_day"] // 100)
        result["checks"] = await _check(conn, sides, result["fill"]["rows"] - expired)
        print("checks:", result["checks"], flush=True)
    finally:
        if "shipped" in conns and conns["shipped"] is not conn:
            await conns["shipped"].close()
        if pool is not None:
            await pool.close()
        await conn.close()
        if not args.keep:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retention", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=500_000)
    parser.add_argument("--hot", type=int, default=5000, help="receipts per hot-path round")
    parser.add_argument("--hot-rounds", type=int, default=3)
    parser.add_argument(
        "--pg-url", default="postgresql://postgres@127.0.0.1:5432/receiver_retention_bench"
    )
    parser.add_argument(
        "--sides",
        default=",".join(SIDES),
        type=lambda value: tuple(value.split(",")),
        help="which designs to build, comma-separated: today, partitioned, shipped (default:"
        " all three); at 100 million receipts run one at a time, each fills half the disk",
    )
    parser.add_argument(
        "--defer-indexes",
        action="store_true",
        help="load into bare heaps and build the primary keys and indexes afterwards, as a"
        " restore does (the only practical way to fill 100 million receipts)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "retention.json"))
    args = parser.parse_args()
    if not args.sides or set(args.sides) - set(SIDES):
        parser.error(f"--sides takes one or more of {', '.join(SIDES)}")
    result = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not result["checks"]["ok"]:
        raise SystemExit("a side does not hold the receipts it should: figures not comparable")


if __name__ == "__main__":
    main()
