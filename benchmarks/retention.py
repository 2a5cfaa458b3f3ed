"""``python -m benchmarks.retention --rows 10000000``: what expiring one day of receipts costs,
today's table against a time-partitioned candidate, on receipts generated in SQL.

Both sides live in one scratch database (``--pg-url``, dropped and created again; default
``receiver_retention_bench``) and are filled in the same run, chunk by chunk, alternating, so
that a busy machine slows both alike.

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
import time
from pathlib import Path
from typing import Any

import asyncpg

from receiver._ops.sweeper import DELETE_BATCH
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


SIDES = ("today", "partitioned")
#: What each side measures: its tables, the partitioned parent last.
_TABLES = {"today": ["receiver_receipts"], "partitioned": ["bench_keys", "bench_bodies"]}


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
    conn: asyncpg.Connection, sides: tuple[str, ...], rows: int, days: int, chunk: int
) -> dict[str, Any]:
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


async def _build_indexes(conn: asyncpg.Connection, statements: list[str]) -> float:
    started = time.perf_counter()
    for statement in statements:
        step = time.perf_counter()
        await conn.execute(statement)
        print(f"  built in {time.perf_counter() - step:6.1f} s: {statement[:90]}", flush=True)
    return time.perf_counter() - started


async def _hot(
    conn: asyncpg.Connection, sides: tuple[str, ...], n: int, rounds: int, day: int
) -> dict[str, list[float]]:
    """Claim + completion, one receipt at a time, interleaved rounds per side (receipts/s),
    into the newest day (the partition claims go to)."""
    out: dict[str, list[float]] = {side: [] for side in sides}
    bucket = f"'{_day(day)}'::date"
    templates = {"today": _HOT_TODAY, "partitioned": _HOT_PARTITIONED}
    for r in range(rounds):
        for side in sides:
            sql = templates[side] % {"n": n, "tag": f"{side}{r}", "bucket": bucket}
            started = time.perf_counter()
            await conn.execute(sql)
            out[side].append(n / (time.perf_counter() - started))
    # The hot rows are not generated receipts: take them out again before the sweep.
    for table in (table for side in sides for table in _TABLES[side]):
        await conn.execute(f"DELETE FROM {table} WHERE webhook_id LIKE 'hot\\_%'")  # noqa: S608
        await conn.execute(f"VACUUM {table}")
    return out


async def _sweep_today(conn: asyncpg.Connection, now: float) -> dict[str, Any]:
    statement = queries("postgresql")["delete_expired"]
    wal = await _wal(conn)
    started = time.perf_counter()
    deleted = batches = 0
    while True:
        n = await conn.fetchval(statement, now, 7 * DAY, DELETE_BATCH)
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
    if len(sides) == 2:
        out["only_in_today"] = await conn.fetchval(
            "SELECT count(*) FROM (SELECT provider, webhook_id, state FROM receiver_receipts"
            " EXCEPT SELECT provider, webhook_id, state FROM bench_bodies) AS d"
        )
        ok = ok and out["only_in_today"] == 0
    out["ok"] = ok
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sides = tuple(side for side in SIDES if side in args.sides)
    tables = [table for side in sides for table in _TABLES[side]]
    admin = await asyncpg.connect(args.pg_url.rsplit("/", 1)[0] + "/postgres")
    name = args.pg_url.rsplit("/", 1)[1]
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(args.pg_url, command_timeout=None)
    result: dict[str, Any] = {"machine": "shared, busy 2-core machine", "args": vars(args)}
    try:
        if "today" in sides:
            await conn.execute((ROOT / "schema.sql").read_text())
        if "partitioned" in sides:
            await conn.execute(_PARTITIONED)
        # Autovacuum would run at its own moments on one side or the other: off for both, and
        # every VACUUM here is explicit and timed.
        for table in tables:
            if table != "bench_bodies":  # its partitions are set as they are created
                await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        rebuild: dict[str, list[str]] = {side: [] for side in sides}
        if args.defer_indexes:
            rebuild = {side: await _defer_indexes(conn, _TABLES[side]) for side in sides}
        print(f"fill {', '.join(sides)}: {args.rows:,} receipts over {args.days} days", flush=True)
        result["fill"] = await _fill(conn, sides, args.rows, args.days, args.chunk)
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
        await conn.execute("CHECKPOINT")
        result["size_before"] = {side: await _sizes(conn, _TABLES[side]) for side in sides}
        print("sizes:", result["size_before"], flush=True)
        result["hot_path_per_s"] = await _hot(conn, sides, args.hot, args.hot_rounds, args.days - 1)
        print("hot path:", result["hot_path_per_s"], flush=True)
        # Expire day 0's completed receipts: "now" is the end of their window.
        now = BASE + 2 * DAY - 0.001
        result["sweep"] = {}
        for side in sides:
            await conn.execute("CHECKPOINT")
            if side == "today":
                result["sweep"][side] = await _sweep_today(conn, now)
            else:
                result["sweep"][side] = await _sweep_partitioned(conn)
            print(f"sweep {side}:", result["sweep"][side], flush=True)
        result["size_after"] = {side: await _sizes(conn, _TABLES[side]) for side in sides}
        print("sizes after:", result["size_after"], flush=True)
        expired = result["fill"]["per_day"] - -(-result["fill"]["per_day"] // 100)
        result["checks"] = await _check(conn, sides, result["fill"]["rows"] - expired)
        print("checks:", result["checks"], flush=True)
    finally:
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
        help="which designs to build: today, partitioned or both (default); at 100 million"
        " receipts run one at a time, each fills half the disk",
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
        parser.error(f"--sides takes one or both of {', '.join(SIDES)}")
    result = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not result["checks"]["ok"]:
        raise SystemExit("a side does not hold the receipts it should: figures not comparable")


if __name__ == "__main__":
    main()
