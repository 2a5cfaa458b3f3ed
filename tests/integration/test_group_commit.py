"""SQLite group commit (issue 15, item 4): the deliveries waiting for SQLite's one writer each
run in a SAVEPOINT of one transaction, and one COMMIT (one fsync, synchronous=FULL kept) ends
the group. Every answer is sent only after that COMMIT; a failing handler rolls back its own
savepoint, never its neighbours'."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx

from receiver import Connection, Event, Provider, Receiver, SQLiteStore
from receiver._ledger.receipts import State
from tests.support import EFFECTS_DDL, PROVIDER, SECRET, body_of, signed


def build(store: SQLiteStore) -> Receiver:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], replay_cache=0)

    @rx.on_startup
    async def create_effects(conn: Connection) -> None:
        await conn.execute(EFFECTS_DDL)

    @rx.on("order.created")
    async def write(event: Event, tx: Connection) -> dict[str, str]:
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence) VALUES ($1, $2, $3)",
            event.provider,
            event.id,
            event.fence,
        )
        if event.payload["data"].get("fail"):
            raise RuntimeError("this one fails, after its write")
        return {"id": event.id}

    return rx


def committed(path: Path, sql: str) -> list[tuple[object, ...]]:
    """Read with a connection of its own: only what was committed."""
    db = sqlite3.connect(path, timeout=10)
    try:
        return list(db.execute(sql))
    finally:
        db.close()


async def test_a_failing_handler_in_a_group_rolls_back_only_its_own_savepoint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.db"
    async with SQLiteStore(path) as store:
        rx = build(store)
        await rx.open()
        try:
            deliveries = [
                (f"msg_{i}", body_of("order.created", n=i, fail=(i % 7 == 3))) for i in range(40)
            ]
            barrier = asyncio.Barrier(len(deliveries))
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=rx), base_url="http://test"
            ) as client:

                async def send(webhook_id: str, body: bytes) -> httpx.Response:
                    await barrier.wait()
                    answer = await client.post(
                        f"/{PROVIDER}", content=body, headers=signed(webhook_id, body)
                    )
                    if answer.status_code == 200:
                        # Answered only after its COMMIT: another connection sees it already.
                        sql = "SELECT state FROM receiver_receipts WHERE webhook_id = '%s'"
                        rows = committed(path, sql % webhook_id)
                        assert rows == [("completed",)]
                    return answer

                answers = await asyncio.gather(*(send(w, b) for w, b in deliveries))
        finally:
            await rx.close()
        group = store._group
        assert group is not None
        assert max(group.sizes) > 1  # deliveries did share commits
    failing = {w for w, b in deliveries if b"true" in b}
    for (webhook_id, _), answer in zip(deliveries, answers, strict=True):
        assert answer.status_code == (500 if webhook_id in failing else 200), answer.text
    effects = {r[0] for r in committed(path, "SELECT webhook_id FROM effects")}
    assert effects == {w for w, _ in deliveries} - failing
    states = dict(committed(path, "SELECT webhook_id, state FROM receiver_receipts"))
    assert {w for w, s in states.items() if s == State.RELEASED.value} == failing


async def test_a_group_left_open_is_committed_soon_even_if_its_waiters_give_up(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.db"
    async with SQLiteStore(path, busy_timeout=0.05) as store:
        async with store.acquire() as conn:
            await conn.execute(EFFECTS_DDL)
        holder_in = asyncio.Event()

        async def member() -> None:
            async with store.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO effects (provider, webhook_id, fence) VALUES ('a', 'w', 1)"
                )
                holder_in.set()
                await asyncio.sleep(0.1)  # a waiter arrives, then gives up (busy_timeout)

        async def impatient() -> None:
            await holder_in.wait()
            try:
                async with store.acquire():
                    pass
            except Exception:
                pass

        await asyncio.wait_for(asyncio.gather(member(), impatient()), 5)
        assert committed(path, "SELECT webhook_id FROM effects") == [("w",)]
        assert store._group is not None
        assert not store._group.open


async def test_an_autocommitted_statement_never_lands_in_an_open_group(tmp_path: Path) -> None:
    async with SQLiteStore(path := tmp_path / "r.db") as store:
        async with store.acquire() as conn:
            await conn.execute(EFFECTS_DDL)
        group = store._group
        assert group is not None
        async with store.acquire() as conn:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO effects (provider, webhook_id, fence) VALUES ('a', 'x', 1)"
                )
            # The member is released, its group still open (its COMMIT comes at the exit of
            # acquire); an autocommitted statement commits the group first.
            assert group.open
            await conn.execute(
                "INSERT INTO effects (provider, webhook_id, fence) VALUES ('a', 'y', 1)"
            )
            assert not group.open
            assert sorted(r[0] for r in committed(path, "SELECT webhook_id FROM effects")) == [
                "x",
                "y",
            ]
