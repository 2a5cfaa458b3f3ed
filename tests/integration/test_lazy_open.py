"""A Receiver that no lifespan opened (mounted where the host app's lifespan does not reach it,
or driven with ``rx.deliver`` from a script) opens on its first delivery: the startup hooks run
before any handler, a store that cannot open is a 503 (and the next delivery tries again), and
a program that never closes the receiver still exits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from receiver import Connection, Event, Provider, Receiver, SQLiteStore, StoreMisconfigured
from tests.servers import ROOT
from tests.support import PROVIDER, SECRET, body_of, signed


def receiver_at(url: str, order: list[str]) -> Receiver:
    rx = Receiver(url, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

    @rx.on_startup
    async def create(conn: Connection) -> None:
        order.append("hook")
        await conn.execute("CREATE TABLE IF NOT EXISTS lazy_orders (id TEXT PRIMARY KEY)")

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> dict[str, str]:
        order.append("handler")
        await tx.execute("INSERT INTO lazy_orders (id) VALUES ($1)", event.payload["data"]["id"])
        return {"id": event.payload["data"]["id"]}

    return rx


async def test_the_first_delivery_runs_the_startup_hooks_first(tmp_path: Path) -> None:
    order: list[str] = []
    rx = receiver_at(f"sqlite:///{tmp_path}/r.db", order)
    transport = httpx.ASGITransport(app=rx)  # no lifespan: nothing opened the receiver
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://rx") as client:
            for n in range(3):
                body = body_of(id=f"o{n}")
                answer = await client.post(
                    f"/{PROVIDER}", content=body, headers=signed(f"m{n}", body)
                )
                assert (answer.status_code, answer.json()) == (200, {"id": f"o{n}"})
    finally:
        await rx.close()
    assert order == ["hook", "handler", "handler", "handler"]


async def test_a_store_that_cannot_open_is_a_503_until_it_can(tmp_path: Path) -> None:
    order: list[str] = []
    missing = tmp_path / "not-yet"
    rx = receiver_at(f"sqlite:///{missing}/r.db", order)
    body = body_of(id="o1")
    try:
        refused = await rx.deliver(PROVIDER, signed("m1", body), body)
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert order == []
        missing.mkdir()
        answer = await rx.deliver(PROVIDER, signed("m1", body), body)
        assert answer.status_code == 200, answer.body
    finally:
        await rx.close()
    assert order == ["hook", "handler"]


async def test_a_file_that_is_not_a_database_is_a_misconfigured_store(tmp_path: Path) -> None:
    """Another file at the ledger's path: 503 saying so (a driver error before), the file kept
    as it was."""
    path = tmp_path / "notes.db"
    path.write_text("meeting notes, not a ledger\n")
    rx = receiver_at(f"sqlite:///{path}", [])
    body = body_of(id="o1")
    try:
        refused = await rx.deliver(PROVIDER, signed("m1", body), body)
    finally:
        await rx.close()
    assert refused.status_code == 503
    assert b"the receipt store is misconfigured" in refused.body, refused.body
    assert path.read_text() == "meeting notes, not a ledger\n"
    with pytest.raises(StoreMisconfigured, match=r"notes\.db is not a SQLite database"):
        await SQLiteStore(path).open()


def test_a_program_that_never_closes_its_receiver_exits(tmp_path: Path) -> None:
    """The SQLite store's thread must not keep the interpreter alive (it did: aiosqlite's
    thread is not a daemon, and a script that forgot ``async with rx`` hung at exit)."""
    script = textwrap.dedent(
        f"""
        import asyncio
        from tests.integration.test_lazy_open import receiver_at
        from tests.support import PROVIDER, body_of, signed

        async def main():
            rx = receiver_at("sqlite:///{tmp_path}/r.db", [])
            body = body_of(id="o1")
            answer = await rx.deliver(PROVIDER, signed("m1", body), body)
            print(answer.status_code)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=20
    )
    assert (done.returncode, done.stdout.strip()) == (0, "200"), done.stderr
