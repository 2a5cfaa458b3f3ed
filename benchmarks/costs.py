"""What one delivery costs, the receiver against the hand-written receivers, counted.

``python -m benchmarks.costs`` (``--pg-url``, ``--count``, ``--concurrency``). For each store
(PostgreSQL, SQLite), handler (no-op; one INSERT through ``tx``) and side (the receiver as
``benchmarks/app.py`` builds it; the hand-written receiver of ``benchmarks/handwritten.py``), it
sends ``--count`` fresh signed ~1 KiB deliveries straight to the ASGI app, ``--concurrency`` at a
time (no HTTP: what is counted is the receiver's own work), each side in a child process of its
own, twice:

- plainly, for the Python CPU time per delivery (``time.process_time()``: both threads, the
  event loop's and aiosqlite's), the database's counters (PostgreSQL: committed transactions of
  the benchmark database, rows inserted, updated and HOT-updated in the side's receipts table,
  the index entries those row versions added, and the WAL the cluster wrote meanwhile);
- under ``strace -f -c``, for the system calls per delivery: ``sendto``/``write`` to the
  database's socket are the round trips (asyncpg sends a statement, or a pipeline of them, in one
  call), ``fdatasync``/``fsync`` the flushes to disk (SQLite's; PostgreSQL's are its own
  processes').

The WAL figure is the cluster's LSN over the side's run: on a shared server other databases'
writes land in it too, so the smallest of the runs is kept, and it is an upper bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from . import load
from .business import PROVIDER

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/receiver_costs"
SECRET = "whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
SIDES = ("receiver", "hand")
HANDLERS = ("noop", "insert")
TABLES = {"receiver": "receiver_receipts", "hand": "hand_receipts"}

ASGI = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


# -- the child: one side, one handler, one store ------------------------------------------------


async def _drive(app: ASGI, count: int, concurrency: int, tag: str) -> tuple[int, float]:
    """Send ``count`` deliveries, ``concurrency`` at a time; (2xx answers, CPU seconds)."""
    ids = load.Ids(tag)
    template = load.Template.make(1024, ids.length)
    signer = load.Signer(SECRET)
    batch = ids.take(count)
    now = int(time.time())
    requests = []
    for wid in batch:
        body = template.body(wid)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"webhook-id", wid.encode()),
            (b"webhook-timestamp", str(now).encode()),
            (b"webhook-signature", signer.sign(wid, now, body).encode()),
        ]
        requests.append((headers, body))
    ok = 0

    async def one(headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        nonlocal ok
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": f"/{PROVIDER}",
            "raw_path": f"/{PROVIDER}".encode(),
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal ok
            if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                ok += 1

        await app(scope, receive, send)

    queue = iter(requests)

    async def worker() -> None:
        for headers, body in queue:
            await one(headers, body)

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, time.process_time() - started


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    side, handler, store = args.side, args.handler, args.store
    url = args.pg_url if store == "postgresql" else f"sqlite:///{args.sqlite}"
    if side == "receiver":
        # benchmarks/app.py builds its receiver from the environment when it is imported.
        os.environ.update(
            BENCH_STORE=url, BENCH_SECRET=SECRET, BENCH_HANDLER=handler, BENCH_ADMISSION="0"
        )
        from .app import app as rx

        async with rx:
            await _drive(rx, args.warmup, args.concurrency, "w")  # plans, caches, pool
            ok, cpu = await _drive(rx, args.count, args.concurrency, "m")
        return {"ok": ok, "cpu_s": cpu}
    from starlette.applications import Starlette
    from starlette.routing import Route

    from . import handwritten

    kind = "pg2" if store == "postgresql" else "sqlite"
    handwritten.KIND, handwritten.HANDLER = kind, handler
    handwritten.STORE = args.pg_url if store == "postgresql" else str(args.sqlite)
    handwritten.webhook = handwritten.Webhook(SECRET)
    endpoint = handwritten.ENDPOINTS[kind]
    app = Starlette(routes=[Route("/{provider}", endpoint, methods=["POST"])])
    async with handwritten.lifespan(app):
        await _drive(app, args.warmup, args.concurrency, "w")
        ok, cpu = await _drive(app, args.count, args.concurrency, "m")
    return {"ok": ok, "cpu_s": cpu}


# -- the parent: fresh stores, counters, the table ------------------------------------------


def _admin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/postgres"))


async def _pg_counters(url: str, table: str) -> dict[str, int]:
    database = urllib.parse.urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(_admin(url))
    try:
        xact = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database
        )
        lsn = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    finally:
        await conn.close()
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = $1",
            table,
        )
    finally:
        await conn.close()
    found = {"xact": int(xact or 0), "wal": int(lsn or 0)}
    if row is not None:
        found.update(ins=int(row[0]), upd=int(row[1]), hot=int(row[2]))
    return found


async def _indexes(url: str, table: str) -> list[dict[str, Any]]:
    """The table's indexes, and whether a row in flight and a completed row have an entry."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT c.relname AS name, pg_get_expr(i.indpred, i.indrelid) AS pred"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = $1::regclass ORDER BY c.relname",
            table,
        )
        found = []
        for r in rows:
            entry: dict[str, Any] = {"name": r["name"], "predicate": r["pred"]}
            for state in ("in_flight", "completed"):
                if r["pred"] is None:
                    entry[state] = True
                else:
                    entry[state] = bool(
                        await conn.fetchval(
                            # A row of the table in that state, still within its window.
                            f"SELECT {r['pred']} FROM jsonb_populate_record(NULL::{table},"  # noqa: S608
                            " jsonb_build_object('state', $1::text, 'expires_at', now()))"
                            f" AS {table}",
                            state,
                        )
                    )
            found.append(entry)
    finally:
        await conn.close()
    return found


async def _prepare_pg(url: str) -> None:
    from receiver import PostgresStore

    from .business import BUSINESS_DDL
    from .handwritten import PG_DDL

    database = urllib.parse.urlsplit(url).path.lstrip("/")
    admin = await asyncpg.connect(_admin(url))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {database}")
    finally:
        await admin.close()
    store = PostgresStore(url)
    async with store:
        await store.migrate()
        async with store.acquire() as conn:
            await conn.execute(BUSINESS_DDL)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(PG_DDL)
    finally:
        await conn.close()


def _prepare_sqlite(path: Path, side: str) -> None:
    """A new file; the receiver's schema (the hand-written receiver makes its own tables)."""
    from receiver import SQLiteStore

    from .business import BUSINESS_DDL

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if side != "receiver":
        return

    async def prepare() -> None:
        store = SQLiteStore(path)
        async with store:
            await store.migrate()
            async with store.acquire() as conn:
                await conn.execute(BUSINESS_DDL)

    asyncio.run(prepare())


def _spawn(
    args: argparse.Namespace, side: str, handler: str, store: str, sqlite: Path, strace: Path | None
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "benchmarks.costs", "--child", "--side", side,
        "--handler", handler, "--store", store, "--pg-url", args.pg_url,
        "--sqlite", str(sqlite), "--count", str(args.count), "--warmup", str(args.warmup),
        "--concurrency", str(args.concurrency),
    ]  # fmt: skip
    if strace is not None:
        command = ["strace", "-f", "-c", "-o", str(strace),
                   "-e", "trace=sendto,write,fdatasync,fsync", *command]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _syscalls(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts and parts[-1] in ("sendto", "write", "fdatasync", "fsync"):
            # "% time seconds usecs/call calls [errors] syscall"
            numbers = [p for p in parts[:-1] if re.fullmatch(r"\d+", p)]
            counts[parts[-1]] = int(numbers[1]) if len(numbers) > 1 else int(numbers[0])
    return counts


def measure(args: argparse.Namespace, store: str, handler: str, side: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="costs-"))
    try:
        sqlite = work / "costs.db"
        n = args.count + args.warmup
        cpus: list[float] = []
        wal: list[int] = []
        counters: dict[str, float] = {}
        for attempt in range(args.runs):
            if store == "postgresql":
                asyncio.run(_prepare_pg(args.pg_url))
                before = asyncio.run(_pg_counters(args.pg_url, TABLES[side]))
            else:
                _prepare_sqlite(sqlite, side)
            got = _spawn(args, side, handler, store, sqlite, None)
            if got["ok"] != args.count:
                raise RuntimeError(f"{store}/{handler}/{side}: {got['ok']} of {args.count} 2xx")
            cpus.append(got["cpu_s"] / args.count)
            if store == "postgresql":
                time.sleep(1.0)  # the backends have exited: their counters are flushed
                after = asyncio.run(_pg_counters(args.pg_url, TABLES[side]))
                wal.append(after["wal"] - before["wal"])
                if attempt == 0:
                    counters = {
                        k: (after[k] - before.get(k, 0)) / n for k in ("xact", "ins", "upd", "hot")
                    }
        result: dict[str, Any] = {"cpu_us": round(min(cpus) * 1e6), **counters}
        if store == "postgresql":
            result["wal_bytes"] = round(min(wal) / n)
            indexes = asyncio.run(_indexes(args.pg_url, TABLES[side]))
            non_hot = counters["upd"] - counters["hot"]
            result["index_entries"] = round(
                sum(counters["ins"] * i["in_flight"] + non_hot * i["completed"] for i in indexes),
                2,
            )
            result["indexes"] = [
                f"{i['name']}{' (partial)' if i['predicate'] else ''}" for i in indexes
            ]
        if shutil.which("strace"):
            if store == "postgresql":
                asyncio.run(_prepare_pg(args.pg_url))
            else:
                _prepare_sqlite(sqlite, side)
            trace = work / "strace.txt"
            _spawn(args, side, handler, store, sqlite, trace)
            calls = _syscalls(trace)
            if store == "postgresql":
                # Every sendto of the process goes to PostgreSQL (no HTTP in process).
                result["round_trips"] = round(calls.get("sendto", 0) / n, 2)
            result["fsyncs"] = round((calls.get("fdatasync", 0) + calls.get("fsync", 0)) / n, 3)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.costs", description=__doc__)
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="dropped and created again")
    parser.add_argument("--count", type=int, default=2000, help="deliveries per side")
    parser.add_argument("--warmup", type=int, default=300, help="deliveries before counting")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2, help="plain runs per side (min CPU)")
    parser.add_argument("--stores", default="postgresql,sqlite")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--handler", choices=HANDLERS, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--sqlite", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(args))))
        return 0
    rows = []
    for store in args.stores.split(","):
        for handler in HANDLERS:
            for side in SIDES:
                got = measure(args, store, handler, side)
                rows.append({"store": store, "handler": handler, "side": side, **got})
                print(json.dumps(rows[-1]), flush=True)
    print()
    print("| store | handler | side | transactions | round trips | fsyncs (process) "
          "| rows ins/upd (HOT) | index entries | WAL bytes | Python CPU us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pg = r["store"] == "postgresql"
        rows_written = f"{r['ins']:.2f}/{r['upd']:.2f} ({r['hot']:.2f})" if pg else "-"
        xact = f"{r['xact']:.2f}" if pg else "-"
        print(
            f"| {r['store']} | {r['handler']} | {r['side']} "
            f"| {xact} | {r.get('round_trips', '-')} | {r.get('fsyncs', '-')} "
            f"| {rows_written} | {r.get('index_entries', '-')} | {r.get('wal_bytes', '-')} "
            f"| {r['cpu_us']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
