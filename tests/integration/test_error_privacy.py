"""Payload values never reach the logs, ``last_error`` or ``receiver_attempts.error`` through a
driver's error text (issue 14 item 12), on both stores; the error class, the SQLSTATE and the
constraint's name are kept, so the failure can still be understood."""

from __future__ import annotations

import logging

import httpx
import pytest

from receiver import Connection, Event, JSONFormatter, Provider, Receiver, Store
from tests.support import PROVIDER, SECRET, body_of, signed

EMAIL = "alice.secret-4711@example.com"
CARD = "4111-1111-1111-1111-zz"


def receiver(store: Store) -> Receiver:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])])

    @rx.on_startup
    async def tables(conn: Connection) -> None:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS people (email TEXT CONSTRAINT people_email_key UNIQUE)"
        )

    @rx.on("person.created")
    async def person(event: Event, tx: Connection) -> None:
        await tx.execute("INSERT INTO people (email) VALUES ($1)", event.payload["data"]["email"])

    @rx.on("card.added")
    async def card(event: Event, tx: Connection) -> None:
        # The server echoes the value it cannot cast (PostgreSQL 22P02).
        await tx.execute("SELECT CAST($1::text AS integer)", event.payload["data"]["card"])

    return rx


async def deliver(client: httpx.AsyncClient, webhook_id: str, body: bytes) -> httpx.Response:
    return await client.post(f"/{PROVIDER}", content=body, headers=signed(webhook_id, body))


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the receiver logged, tracebacks included (a driver's own debug logging, such
    as aiosqlite's, is the application's choice to enable)."""
    mine = [r for r in caplog.records if r.name.startswith("receiver")]
    plain, structured = logging.Formatter(), JSONFormatter()
    return "\n".join(f"{plain.format(r)}\n{structured.format(r)}" for r in mine)


async def errors(store: Store) -> list[str]:
    async with store.acquire() as conn:
        kept = await conn.fetch("SELECT last_error FROM receiver_receipts WHERE state = 'released'")
        attempts = await conn.fetch("SELECT error FROM receiver_attempts")
    return [r["last_error"] for r in kept] + [r["error"] for r in attempts]


async def test_a_unique_violation_keeps_the_constraint_not_the_value(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="receiver")
    rx = receiver(store)
    await rx.open()
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        body = body_of("person.created", email=EMAIL)
        assert (await deliver(client, "msg_1", body)).status_code == 200
        # Another event for the same person: the handler's insert violates the constraint.
        again = body_of("person.created", email=EMAIL, note="second")
        assert (await deliver(client, "msg_2", again)).status_code == 500
    kept = await errors(store)
    assert len(kept) == 2  # last_error and the attempt
    for text in [*kept, logged(caplog)]:
        assert EMAIL not in text
        assert "alice" not in text
    for text in kept:
        assert "IntegrityError" in text or "UniqueViolationError" in text
        assert "people_email_key" in text or "people.email" in text
    if store.dialect == "postgresql":
        assert "SQLSTATE 23505" in kept[0]
    assert "handler failed" in logged(caplog)


async def test_a_cast_error_does_not_echo_the_value(
    pg_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="receiver")
    rx = receiver(pg_store)
    await rx.open()
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answer = await deliver(client, "msg_card", body_of("card.added", card=CARD))
    assert answer.status_code == 500
    kept = await errors(pg_store)
    assert len(kept) == 2
    for text in [*kept, logged(caplog)]:
        assert CARD not in text
        assert "4111" not in text
    assert "InvalidTextRepresentationError" in kept[0]
    assert "SQLSTATE 22P02" in kept[0]
