"""The console on a large ledger (PostgreSQL): the overview and the lists answer within a loose
time bound, and every statement they run reads through an index, never the whole table (the
plans are checked, not only the times: a seq scan is fast on a warm 300k-row table and slow at
10M). The ledger is generated in the database with generate_series, in a few seconds."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from receiver import PostgresStore
from receiver._console import Console, live
from receiver._console import queries as console_queries
from receiver._store.queries import queries

pytestmark = pytest.mark.postgres

N = 300_000
DAY = 86400.0

FILL = f"""
INSERT INTO receiver_receipts
    (provider, webhook_id, payload_hash, state, fence, event_type, claimed_at, lease_until,
     expires_at, completed_at, response_status, response_content_type, response_body, attempts,
     last_error)
SELECT CASE WHEN i % 1000 = 7 THEN 'rare'
            WHEN i % 20 = 1 THEN 'action:refund'
            WHEN i % 20 = 2 THEN 'idem:api'
            WHEN i % 3 = 0 THEN 'billing' ELSE 'shop' END,
       CASE WHEN i % 20 = 2 THEN '["tenant-' || (i % 7) || '","key-' || i || '"]'
            ELSE 'msg_' || i END,
       sha256(i::text::bytea),
       CASE WHEN i % 2000 = 3 THEN 'in_flight' WHEN i % 1000 = 5 THEN 'failed'
            WHEN i % 500 = 4 THEN 'released' ELSE 'completed' END,
       1,
       CASE WHEN i % 10000 = 9 THEN 'order.refunded' ELSE 'order.created' END,
       now() - (i * {DAY} / {N}) * interval '1 second',
       now() - (i * {DAY} / {N}) * interval '1 second' + interval '60 seconds',
       now() - (i * {DAY} / {N}) * interval '1 second' + interval '2 days',
       CASE WHEN i % 2000 = 3 THEN NULL ELSE now() END,
       200, 'application/json',
       CASE WHEN i % 5000 = 5 THEN '{{"status":"needs_review"}}'::bytea
            ELSE '{{"ok":true}}'::bytea END,
       CASE WHEN i % 1000 = 5 OR i % 500 = 4 THEN 1 ELSE 0 END,
       CASE WHEN i % 1000 = 5 OR i % 500 = 4 THEN 'RuntimeError: timeout' END
FROM generate_series(1, {N}) AS i
"""

AUDIT = f"""
INSERT INTO receiver_audit (at, actor, action, provider, webhook_id, fence, reason, outcome)
SELECT now() - (i * {DAY} / 20000) * interval '1 second', 'ada', 'replay', 'shop', 'msg_' || i, 1,
       'generated', 'executed'
FROM generate_series(1, 20000) AS i
"""

ATTEMPTS = """
INSERT INTO receiver_attempts (provider, webhook_id, fence, failed_at, error)
SELECT provider, webhook_id, 1, claimed_at, last_error FROM receiver_receipts WHERE attempts > 0
"""


async def clear(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE receiver_receipts, receiver_attempts, receiver_audit")


async def fill(url: str) -> float:
    conn = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        await clear(conn)
        await conn.execute(FILL)
        await conn.execute(ATTEMPTS)
        await conn.execute(AUDIT)
        await conn.execute("VACUUM ANALYZE receiver_audit")
        await conn.execute("VACUUM ANALYZE receiver_receipts")
        await conn.execute("VACUUM ANALYZE receiver_attempts")
        return time.perf_counter() - started
    finally:
        await conn.close()


async def empty(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await clear(conn)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def large(pg_url: str) -> Iterator[str]:
    """One generated ledger for the module (its tests only read it)."""
    print(f"generated {N} receipts in {asyncio.run(fill(pg_url)):.1f} s")
    yield pg_url
    asyncio.run(empty(pg_url))


@pytest.fixture
async def client(large: str) -> AsyncIterator[httpx.AsyncClient]:
    console = Console(PostgresStore(large))
    async with (
        console.lifespan(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console), base_url="http://console.test"
        ) as client,
    ):
        yield client


async def timed(client: httpx.AsyncClient, path: str) -> tuple[float, str]:
    started = time.perf_counter()
    response = await client.get(path)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text[:500]
    return elapsed, response.text


@pytest.mark.parametrize("chart", ["1h", "24h", "7d"])
async def test_the_overview_stays_fast_on_a_large_ledger(
    client: httpx.AsyncClient, chart: str
) -> None:
    await timed(client, f"/?range={chart}")  # warm the pool and the statement cache
    elapsed, page = await timed(client, f"/?range={chart}")
    print(f"overview ({chart}) on {N} receipts: {elapsed * 1000:.0f} ms")
    assert elapsed < 2.0, f"the overview took {elapsed:.2f} s"
    assert "rare" in page
    assert "action:refund" in page
    assert "idem:api" in page
    assert "Needs review" in page


@pytest.mark.parametrize(
    "path",
    [
        "/receipts",
        "/receipts?provider=rare",
        "/receipts?type=order.refunded",  # rare: the bounded walk says how far it looked
        "/receipts?state=failed&since=24h",
        "/keys?principal=tenant-3",
        "/actions",
        "/attention?list=failed",
        "/attention?list=needs_review",
        "/attention?list=stale",
        "/receipts?id=msg_150001",
        "/live",
        "/bulk?count=1",
        "/bulk?count=1&provider=shop&error=timeout&since=24h",
    ],
)
async def test_the_lists_stay_fast_on_a_large_ledger(client: httpx.AsyncClient, path: str) -> None:
    await timed(client, path)
    elapsed, _ = await timed(client, path)
    print(f"{path} on {N} receipts: {elapsed * 1000:.0f} ms")
    assert elapsed < 2.0, f"{path} took {elapsed:.2f} s"


async def test_a_rare_filter_pages_back_through_the_ledger(client: httpx.AsyncClient) -> None:
    _, page = await timed(client, "/receipts?type=order.refunded")
    assert "Looked back to" in page
    found = re.findall(r"msg_(\d+)</a>", page)
    assert found
    assert all(int(i) % 10000 == 9 for i in found)
    # Each page reads a bounded number of entries per provider, so older matches take a few
    # more pages (some of them empty, each saying how far back it looked), never a full scan.
    seen = set(found)
    for _ in range(10):
        after = re.search(r'href="([^"]*after=[^"]*)"', page)
        assert after is not None
        elapsed, page = await timed(client, after.group(1).replace("&amp;", "&"))
        assert elapsed < 2.0
        more = re.findall(r"msg_(\d+)</a>", page)
        assert all(int(i) % 10000 == 9 for i in more)
        assert not seen & set(more)  # never the same receipt twice
        seen |= set(more)
        if len(seen) >= 3:
            break
    assert sorted(map(int, seen))[:3] == [9, 10009, 20009]


# Each list statement, with the values a page passes, under the generic plan a long-lived
# prepared statement ends up with: never a scan of the ledger.
PLANS: dict[str, tuple[list[Any], str]] = {
    "console_providers": ([], "receiver_receipts_pkey"),
    "console_receipts": (
        ["shop", None, None, None, "", "order.refunded", "", 2000, 50, None],
        "receiver_receipts_provider_claimed",
    ),
    "console_horizon": (
        ["shop", None, None, None, 2000],
        "receiver_receipts_provider_claimed",
    ),
    "console_replay_chart": ([time.time() - DAY, 3600.0, 24, 2000], "receiver_audit_at"),
    "console_dead_letters": (
        ["", "failed", None, None, None, 50, None],
        "receiver_receipts_released_failed",
    ),
    "console_in_flight": (["", True, None, None, None, 50, None], "receiver_receipts_in_flight"),
    "console_needs_review_counts": ([], "receiver_receipts_released_failed"),
    "console_delivery_chart": (
        ["shop", time.time() - DAY, 3600.0, 24, 2000],
        "receiver_receipts_provider_claimed",
    ),
    "console_failure_chart": ([time.time() - DAY, 3600.0, 24, 2000], "receiver_attempts_failed_at"),
    "console_audit_list": ([None, 50], "receiver_audit_pkey"),
    "console_audit_of": (["shop", "msg_1", 50], "receiver_audit_key"),
    # The live overview: one probe for the backlog, bounded walks for the recent numbers.
    "live_backlog": (["shop"], "receiver_receipts_backlog"),
    "live_recent": (["shop", time.time() - 900, 2000], "receiver_receipts_provider_claimed"),
    "live_failures": ([time.time() - 900, 2000], "receiver_attempts_failed_at"),
    # A bulk replay's dry run and snapshot read the small states only.
    "bulk_count": (
        ["", "", "", None, None, "timeout", 100_001],
        "receiver_receipts_released_failed",
    ),
    "bulk_match": (
        ["shop", "failed", "", None, None, "", 20],
        "receiver_receipts_released_failed",
    ),
}


@pytest.mark.parametrize("name", sorted(PLANS))
async def test_every_list_reads_through_an_index(large: str, name: str) -> None:
    args, index = PLANS[name]
    conn = await asyncpg.connect(large)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        statement = await conn.prepare(queries("postgresql")[name])
        rows = await statement.explain(*args)
    finally:
        await conn.close()
    plan = _text(rows)
    assert "Seq Scan on receiver_receipts" not in plan, plan
    assert "Seq Scan on receiver_attempts" not in plan, plan
    assert index in plan, plan


def _text(node: Any) -> str:
    """Every relation and index a JSON plan names, one per line."""
    found: list[str] = []

    def walk(n: Any) -> None:
        if isinstance(n, dict):
            kind = n.get("Node Type", "")
            if "Relation Name" in n:
                found.append(f"{kind} on {n['Relation Name']}")
            if "Index Name" in n:
                found.append(f"{kind} using {n['Index Name']}")
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    walk(node)
    return "\n".join(found)


async def test_a_live_reading_stays_fast_on_a_large_ledger(large: str) -> None:
    """The live overview reads each provider's newest 15 minutes (bounded walks) and one
    backlog probe: measured here without the reading the console shares between pages."""
    async with PostgresStore(large) as store, store.acquire() as conn:
        names = [p for p in await console_queries.providers(conn) if ":" not in p]
        await live.read(conn, time.time(), names)
        started = time.perf_counter()
        reading = await live.read(conn, time.time(), names)
        elapsed = time.perf_counter() - started
    print(f"live reading of {len(names)} providers on {N} receipts: {elapsed * 1000:.0f} ms")
    assert elapsed < 2.0
    shop = next(p for p in reading.providers if p.name == "shop")
    assert shop.backlog_age is not None  # released receipts wait
    assert 0 < shop.windows[0].completed <= shop.windows[2].completed
