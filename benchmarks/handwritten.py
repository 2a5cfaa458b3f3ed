"""The receivers people write by hand: the references the receiver is measured against.

What a careful engineer writes in an afternoon with the same parts: verify with the
``standardwebhooks`` package, dedup on a unique key, answer, replay the stored answer to a
redelivery. No leases, fences, crash recovery, key-drift alerts or metrics. Served by the runner
exactly like the receiver (``uvicorn benchmarks.handwritten:app``), chosen by environment:

    HAND_KIND     pg2      asyncpg: INSERT ... ON CONFLICT DO NOTHING claim, then an UPDATE
                           that completes it (two statements, two commits)
                  pg1      asyncpg: one INSERT of the completed receipt, ON CONFLICT DO NOTHING
                           RETURNING (the answer is stored before the handler runs: not crash-safe
                           for anything the handler does; the fastest possible dedup)
                  sqlite   aiosqlite, WAL, synchronous=NORMAL (no fsync per commit): claim then
                           complete, two statements; one connection, held (an asyncio lock) for
                           one unit of work at a time: the claim, then the completion (with the
                           business row, in a transaction), so that concurrent deliveries'
                           statements queue on aiosqlite's thread back to back
                  sqlite_serial  the same, with the lock held for the whole delivery (claim,
                           handler, completion): every delivery waits for the one before it to
                           make two or four hops to aiosqlite's thread and back
    HAND_STORE    postgresql://... or the SQLite file path
    HAND_SECRET   the whsec_ secret
    HAND_HANDLER  noop | insert (insert: one business row, in a transaction with the completion)
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite
import asyncpg
import orjson
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

KIND = os.environ.get("HAND_KIND", "pg2")
STORE = os.environ.get("HAND_STORE", "")
HANDLER = os.environ.get("HAND_HANDLER", "noop")
webhook = Webhook(os.environ.get("HAND_SECRET", "whsec_" + "A" * 32))

PG_DDL = """
CREATE TABLE IF NOT EXISTS hand_receipts (
    id text PRIMARY KEY, state text NOT NULL, status int, body bytea, created_at timestamptz
);
CREATE TABLE IF NOT EXISTS hand_business (id text PRIMARY KEY, amount int)
"""
SQLITE_DDL = [
    "CREATE TABLE IF NOT EXISTS hand_receipts (id TEXT PRIMARY KEY, state TEXT NOT NULL, "
    "status INT, body BLOB, created_at REAL)",
    "CREATE TABLE IF NOT EXISTS hand_business (id TEXT PRIMARY KEY, amount INT)",
]

state: dict[str, Any] = {}


def verify(request: Request, body: bytes) -> dict[str, Any] | None:
    try:
        payload: dict[str, Any] = webhook.verify(body, dict(request.headers))
    except Exception:
        return None
    return payload


async def pg2(request: Request) -> Response:
    body = await request.body()
    payload = verify(request, body)
    if payload is None:
        return Response(b'{"error":"signature"}', 401, media_type="application/json")
    wid = request.headers["webhook-id"]
    pool: asyncpg.Pool = state["pool"]
    async with pool.acquire() as conn:
        claimed = await conn.fetchval(
            "INSERT INTO hand_receipts (id, state, created_at) VALUES ($1, 'in_flight', now()) "
            "ON CONFLICT (id) DO NOTHING RETURNING true",
            wid,
        )
        if not claimed:
            return await _replay_pg(conn, wid)
        answer = orjson.dumps({"id": wid})
        if HANDLER == "insert":
            async with conn.transaction():
                await conn.execute("INSERT INTO hand_business VALUES ($1, $2)", wid, 1)
                await conn.execute(
                    "UPDATE hand_receipts SET state = 'completed', status = 200, body = $2 "
                    "WHERE id = $1",
                    wid,
                    answer,
                )
        else:
            await conn.execute(
                "UPDATE hand_receipts SET state = 'completed', status = 200, body = $2 "
                "WHERE id = $1",
                wid,
                answer,
            )
    return Response(answer, 200, media_type="application/json")


async def pg1(request: Request) -> Response:
    body = await request.body()
    payload = verify(request, body)
    if payload is None:
        return Response(b'{"error":"signature"}', 401, media_type="application/json")
    wid = request.headers["webhook-id"]
    answer = orjson.dumps({"id": wid})
    pool: asyncpg.Pool = state["pool"]
    async with pool.acquire() as conn:
        if HANDLER == "insert":
            async with conn.transaction():
                claimed = await conn.fetchval(
                    "INSERT INTO hand_receipts VALUES ($1, 'completed', 200, $2, now()) "
                    "ON CONFLICT (id) DO NOTHING RETURNING true",
                    wid,
                    answer,
                )
                if claimed:
                    await conn.execute("INSERT INTO hand_business VALUES ($1, $2)", wid, 1)
        else:
            claimed = await conn.fetchval(
                "INSERT INTO hand_receipts VALUES ($1, 'completed', 200, $2, now()) "
                "ON CONFLICT (id) DO NOTHING RETURNING true",
                wid,
                answer,
            )
        if not claimed:
            return await _replay_pg(conn, wid)
    return Response(answer, 200, media_type="application/json")


async def _replay_pg(conn: asyncpg.Connection, wid: str) -> Response:
    row = await conn.fetchrow("SELECT state, status, body FROM hand_receipts WHERE id = $1", wid)
    if row is None or row["state"] != "completed":
        return Response(b'{"error":"in_flight"}', 409, media_type="application/json")
    return Response(bytes(row["body"]), row["status"], media_type="application/json")


async def sqlite(request: Request) -> Response:
    """The connection is held for one unit of work at a time (claim; completion)."""
    body = await request.body()
    payload = verify(request, body)
    if payload is None:
        return Response(b'{"error":"signature"}', 401, media_type="application/json")
    wid = request.headers["webhook-id"]
    async with state["lock"]:
        replayed = await _claim_sqlite(wid)
    if replayed is not None:
        return replayed
    answer = orjson.dumps({"id": wid})
    async with state["lock"]:
        await _complete_sqlite(wid, answer)
    return Response(answer, 200, media_type="application/json")


async def sqlite_serial(request: Request) -> Response:
    """The connection is held for the whole delivery."""
    body = await request.body()
    payload = verify(request, body)
    if payload is None:
        return Response(b'{"error":"signature"}', 401, media_type="application/json")
    wid = request.headers["webhook-id"]
    answer = orjson.dumps({"id": wid})
    async with state["lock"]:
        replayed = await _claim_sqlite(wid)
        if replayed is not None:
            return replayed
        await _complete_sqlite(wid, answer)
    return Response(answer, 200, media_type="application/json")


async def _claim_sqlite(wid: str) -> Response | None:
    """None if claimed now; else the answer to a redelivery."""
    db: aiosqlite.Connection = state["db"]
    cursor = await db.execute(
        "INSERT INTO hand_receipts (id, state, created_at) VALUES (?, 'in_flight', "
        "unixepoch()) ON CONFLICT (id) DO NOTHING RETURNING 1",
        (wid,),
    )
    claimed = await cursor.fetchone()
    await cursor.close()
    if claimed is not None:
        return None
    rows = await db.execute_fetchall(
        "SELECT state, status, body FROM hand_receipts WHERE id = ?", (wid,)
    )
    row = next(iter(rows), None)
    if row is None or row[0] != "completed":
        return Response(b'{"error":"in_flight"}', 409, media_type="application/json")
    return Response(bytes(row[2]), row[1], media_type="application/json")


async def _complete_sqlite(wid: str, answer: bytes) -> None:
    db: aiosqlite.Connection = state["db"]
    if HANDLER == "insert":
        await db.execute("BEGIN")
        await db.execute("INSERT INTO hand_business VALUES (?, ?)", (wid, 1))
    await db.execute(
        "UPDATE hand_receipts SET state = 'completed', status = 200, body = ? WHERE id = ?",
        (answer, wid),
    )
    if HANDLER == "insert":
        await db.execute("COMMIT")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    import asyncio

    if KIND.startswith("sqlite"):
        db = await aiosqlite.connect(STORE, isolation_level=None)
        await db.execute("PRAGMA journal_mode = WAL")
        await db.execute("PRAGMA synchronous = NORMAL")
        for ddl in SQLITE_DDL:
            await db.execute(ddl)
        state["db"], state["lock"] = db, asyncio.Lock()
        yield
        await db.close()
        return
    # The asyncpg pool's reset query is skipped, as a careful hand would (no session state).
    pool = await asyncpg.create_pool(STORE, min_size=1, max_size=10, reset=_no_reset)
    async with pool.acquire() as conn:
        await conn.execute(PG_DDL)
    state["pool"] = pool
    yield
    await pool.close()


async def _no_reset(conn: asyncpg.Connection) -> None:
    pass


ENDPOINTS = {"pg2": pg2, "pg1": pg1, "sqlite": sqlite, "sqlite_serial": sqlite_serial}
app = Starlette(routes=[Route("/{provider}", ENDPOINTS[KIND], methods=["POST"])], lifespan=lifespan)
