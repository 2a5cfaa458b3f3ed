"""How long the sweeper keeps dead letters and the console's audit records, on both stores:
the configured retentions (constructor arguments and configuration keys) and their defaults,
applied by the same bounded pass that deletes expired receipts, batch by batch, oldest first;
and on PostgreSQL, a batch of old audit records, of completed receipts or of dead letters is
read through an index of its own, never past the rows it keeps."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest

from receiver import Actions, ConfigurationError, PostgresStore, Receiver, Store, load_config
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Claimed, Key, StoredResponse
from receiver._ops import sweeper
from receiver._store.queries import queries
from tests.support import ROW_EXPIRY, Clock, ledger_clock

DAY = 86_400.0
T0 = 1_900_000_000.0


async def audit_at(store: Store, *ages: float) -> None:
    """One audit record per age (days before T0)."""
    async with store.acquire() as conn:
        for age in ages:
            await conn.run(
                "console_audit_add", T0 - age * DAY, "ada", "replay", "shop", f"w{age}", 1, "r", "x"
            )


async def audit_ages(store: Store) -> list[str]:
    async with store.acquire() as conn:
        rows = await conn.run_all("console_audit_list", None, 100)
    return sorted(r["webhook_id"] for r in rows)


async def dead_letter(store: Store, webhook_id: str, days_past_window: float) -> None:
    """A delivery released after a failed attempt whose window ended that long before T0."""
    key = Key("shop", webhook_id)
    start = T0 - (days_past_window + 1) * DAY
    async with store.acquire() as conn:
        got = await ledger.claim(conn, Claim(key, b"h" * 32, "t", b"{}", start, 60, DAY))
        assert isinstance(got, Claimed)
        assert await ledger.release(conn, key, got.fence, "boom", start)


async def receipt_ids(store: Store) -> list[str]:
    async with store.acquire() as conn:
        rows = await conn.fetch("SELECT webhook_id FROM receiver_receipts ORDER BY webhook_id")
    return [r["webhook_id"] for r in rows]


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_the_receivers_retentions_and_their_defaults(store: Store) -> None:
    ledger_clock(store, Clock(T0))
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_audit")
    await audit_at(store, 400, 100, 1)
    for webhook_id, days in (("d20", 20), ("d5", 5)):
        await dead_letter(store, webhook_id, days)

    default = await Receiver(store, sweep_interval=None).sweep()
    assert (default.deleted, default.audit_deleted) == (1, 1)  # past 7 days, past 365 days
    assert await audit_ages(store) == ["w1", "w100"]
    assert await receipt_ids(store) == ["d5"]

    await dead_letter(store, "d20", 20)
    kept = Receiver(store, sweep_interval=None, dead_letter_retention=30 * DAY)
    assert (await kept.sweep()).deleted == 0
    shorter = Receiver(
        store, sweep_interval=None, dead_letter_retention=2 * DAY, audit_retention=90 * DAY
    )
    report = await shorter.sweep()
    assert (report.deleted, report.audit_deleted) == (2, 1)
    assert await audit_ages(store) == ["w1"]
    assert await receipt_ids(store) == []


async def test_old_audit_records_go_in_bounded_batches_oldest_first(store: Store) -> None:
    ledger_clock(store, Clock(T0))
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_audit")
    await audit_at(store, *(10 + n for n in range(7)), 1)
    report = await sweeper.sweep(store, None, now=T0, delete_batch=2, audit_retention=5 * DAY)
    assert report.audit_deleted == 7
    assert await audit_ages(store) == ["w1"]
    # A spent budget stops after one batch; the oldest go first.
    await audit_at(store, 30, 20, 10)
    report = await sweeper.sweep(
        store, None, now=T0, delete_batch=2, budget=0.0, audit_retention=5 * DAY
    )
    assert report.audit_deleted == 2
    assert await audit_ages(store) == ["w1", "w10"]


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_an_executor_on_a_bare_store_keeps_its_own_retentions(store: Store) -> None:
    ledger_clock(store, Clock(T0))
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_audit")
    await audit_at(store, 50)
    await dead_letter(store, "d3", 3)
    actions = Actions(
        store, sweep_interval=None, dead_letter_retention=1 * DAY, audit_retention=DAY
    )
    report = await actions.sweep()
    assert (report.deleted, report.audit_deleted) == (1, 1)
    rx = Receiver(store, sweep_interval=None)
    with pytest.raises(ConfigurationError, match="give dead_letter_retention"):
        Actions(rx, audit_retention=DAY)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "7d", True])
def test_a_retention_is_finite_seconds(bad: object) -> None:
    for name in ("dead_letter_retention", "audit_retention"):
        with pytest.raises(ConfigurationError, match=name):
            Receiver("sqlite:///unused.db", sweep_interval=None, **{name: bad})  # type: ignore[arg-type]


PROVIDER = '\n[providers.shop]\nsecrets_env = ["SHOP_SECRET"]\n'
ENV = {"SHOP_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}


def test_the_configuration_keys(tmp_path: Path) -> None:
    path = tmp_path / "receiver.toml"
    store = f'store = "sqlite:///{tmp_path}/x.db"\n'
    path.write_text(f'{store}dead_letter_retention = "30d"\naudit_retention = "90d"\n{PROVIDER}')
    config = load_config(path)
    assert (config.dead_letter_retention, config.audit_retention) == (30 * DAY, 90 * DAY)
    rx = config.receiver(environ=ENV)
    assert (rx.dead_letter_retention, rx.audit_retention) == (30 * DAY, 90 * DAY)
    path.write_text(store + PROVIDER)
    defaults = load_config(path)
    assert (defaults.dead_letter_retention, defaults.audit_retention) == (7 * DAY, 365 * DAY)
    path.write_text(f'{store}audit_retention = "forever"\n{PROVIDER}')
    with pytest.raises(ConfigurationError, match="audit_retention"):
        load_config(path)


async def test_a_batch_of_old_audit_records_reads_the_index(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("DELETE FROM receiver_audit")
        await conn.execute(
            "INSERT INTO receiver_audit (at, actor, action, provider, webhook_id, reason) "
            "SELECT now() - i * interval '1 hour', 'ada', 'replay', 'shop', 'w' || i, 'r' "
            "FROM generate_series(1, 20000) AS i"
        )
        await conn.execute("ANALYZE receiver_audit")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        sql = queries("postgresql")["delete_old_audit"]
        await conn.execute(f"PREPARE old_audit (float8, float8, int) AS {sql}")
        rows = await conn.fetch(f"EXPLAIN EXECUTE old_audit ({T0}, 86400, 5000)")
        plan = "\n".join(r[0] for r in rows)
        assert "receiver_audit_at" in plan, plan
        assert "Seq Scan on receiver_audit" not in plan, plan
    finally:
        await conn.execute("DELETE FROM receiver_audit")
        await conn.close()


async def completed_at(store: Store, webhook_id: str, days_past_window: float) -> None:
    key = Key("shop", webhook_id)
    start = T0 - (days_past_window + 1) * DAY
    async with store.acquire() as conn:
        got = await ledger.claim(conn, Claim(key, b"h" * 32, "t", b"{}", start, 60, DAY))
        assert isinstance(got, Claimed)
        await ledger.complete(conn, key, got.fence, StoredResponse(200, None, b"{}"), start)


@pytest.mark.single_layout(ROW_EXPIRY)
async def test_a_batch_takes_completed_receipts_then_dead_letters_within_its_size(
    store: Store,
) -> None:
    ledger_clock(store, Clock(T0))
    for n in range(3):
        await completed_at(store, f"c{n}", 1)
    for n in range(5):
        await dead_letter(store, f"d{n}", 10)
    await dead_letter(store, "kept", 1)
    async with store.acquire() as conn:
        first = await conn.run_all("delete_expired", T0, 7 * DAY, 4)
    assert sum(int(r["n"]) for r in first) == 4
    assert not [i for i in await receipt_ids(store) if i.startswith("c")]  # completed go first
    report = await sweeper.sweep(store, None, now=T0, delete_batch=2)
    assert report.deleted == 4
    assert await receipt_ids(store) == ["kept"]


async def test_a_sweep_batch_reads_each_state_from_its_own_index(pg_url: str) -> None:
    """Dead letters kept within their retention are never walked by a batch of completed
    receipts (each state has its partial index), and no keyed statement can take those."""
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("TRUNCATE receiver_receipts, receiver_attempts")
        await conn.execute(
            "INSERT INTO receiver_receipts (provider, webhook_id, payload_hash, state, fence, "
            "claimed_at, lease_until, expires_at, attempts) "
            "SELECT 'shop', 'd' || i, sha256(i::text::bytea), 'failed', 1, now(), now(), "
            "now() - interval '1 day', 3 FROM generate_series(1, 20000) AS i"
        )
        await conn.execute("ANALYZE receiver_receipts")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        sql = queries("postgresql")["delete_expired"]
        await conn.execute(f"PREPARE expired (float8, float8, int) AS {sql}")
        rows = await conn.fetch(f"EXPLAIN EXECUTE expired ({T0}, {7 * DAY}, 5000)")
        plan = "\n".join(r[0] for r in rows)
        assert "Index Scan using receiver_receipts_completed_expiry" in plan, plan
        assert "Index Scan using receiver_receipts_dead_letter_expiry" in plan, plan
    finally:
        await conn.execute("TRUNCATE receiver_receipts, receiver_attempts")
        await conn.close()


async def bulk_job(
    store: Store, job: int, state: str, ended_days: float | None, items: int
) -> None:
    """A bulk replay with ``items`` keys that ended ``ended_days`` before T0 (None: running)."""
    pg = store.dialect == "postgresql"
    if pg:
        values = "$2::bigint, 'r' || $2::text, to_timestamp($1::float8), 'ada', 'outage',"
        values += " 'provider=shop', $3, 0, 10, $4, to_timestamp($1::float8),"
        values += " to_timestamp($5::float8)"
    else:
        values = "?2, 'r' || ?2, ?1, 'ada', 'outage', 'provider=shop', ?3, 0, 10, ?4, ?1, ?5"
    ended = None if ended_days is None else T0 - ended_days * DAY
    async with store.acquire() as conn:
        await conn.execute(
            "INSERT INTO receiver_bulk_jobs (id, request, created_at, actor, reason, filter,"
            f" total, done, rate, state, lease_until, finished_at) VALUES ({values})",
            T0 - 500 * DAY,
            job,
            items,
            state,
            ended,
        )
        for seq in range(1, items + 1):
            await conn.execute(
                "INSERT INTO receiver_bulk_items (job, seq, provider, webhook_id, fence, state)"
                + (
                    " VALUES ($1, $2, 'shop', $3, 1, 'done')"
                    if pg
                    else " VALUES (?, ?, 'shop', ?, 1, 'done')"
                ),
                job,
                seq,
                f"w{job}-{seq}",
            )


async def bulk_left(store: Store) -> tuple[list[int], list[int]]:
    """The bulk jobs left, and the job of each item left."""
    async with store.acquire() as conn:
        jobs = await conn.fetch("SELECT id FROM receiver_bulk_jobs ORDER BY id")
        items = await conn.fetch("SELECT job FROM receiver_bulk_items ORDER BY job, seq")
    return [int(r["id"]) for r in jobs], [int(r["job"]) for r in items]


async def test_ended_bulk_replays_go_with_the_audit_retention(store: Store) -> None:
    """A bulk replay that ended before the audit retention loses its keys, batch by batch, then
    its job; a running one, or one that ended within the retention, is kept whole."""
    ledger_clock(store, Clock(T0))
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_bulk_items")
        await conn.execute("DELETE FROM receiver_bulk_jobs")
    await bulk_job(store, 1, "done", 400, 5)
    await bulk_job(store, 2, "cancelled", 10, 2)
    await bulk_job(store, 3, "running", None, 2)

    await sweeper.sweep(store, None, now=T0, delete_batch=2)  # the default: a year
    assert await bulk_left(store) == ([2, 3], [2, 2, 3, 3])
    await sweeper.sweep(store, None, now=T0, delete_batch=2, audit_retention=5 * DAY)
    assert await bulk_left(store) == ([3], [3, 3])


async def test_a_role_that_may_not_delete_bulk_replays_still_counts_its_audit_deletions(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role with DELETE on receiver_audit but not on the bulk replays' tables: the old audit
    records go and are counted, the bulk replays stay, and the sweeper says once what to
    grant."""
    role = f"receiver_audit_only_{os.getpid()}"
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute("TRUNCATE receiver_audit, receiver_bulk_jobs, receiver_bulk_items")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
        await admin.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON receiver_receipts, receiver_attempts,"
            f" receiver_migrations TO {role};"
            f" GRANT SELECT, DELETE ON receiver_audit TO {role};"
            f" GRANT SELECT ON receiver_bulk_jobs, receiver_bulk_items TO {role}"
        )
        async with PostgresStore(pg_url) as owner:
            await audit_at(owner, 400, 401)
            await bulk_job(owner, 1, "done", 400, 2)
        async with PostgresStore(pg_url.replace("postgres@", f"{role}@", 1)) as limited:
            report = await sweeper.sweep(limited, None, now=T0)
            assert report.audit_deleted == 2
            assert await bulk_left(owner) == ([1], [1, 1])
            await sweeper.sweep(limited, None, now=T0)
        warned = [r for r in caplog.records if "receiver_bulk_items" in r.getMessage()]
        assert len(warned) == 1
    finally:
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
