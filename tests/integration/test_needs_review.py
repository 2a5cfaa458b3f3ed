"""Every path to needs-review moves the series the ReceiverNeedsReview alert reads
(``receiver_needs_review_total``) and leaves a reason in ``last_error`` and an attempt row, so
that ``receiver failed`` lists the receipt with attempts > 0: the redelivery of an interrupted
external handler without reconcile, the sweeper's recovery of one, and a stale receipt whose
provider is gone. On both stores."""

from __future__ import annotations

import httpx
import pytest

from receiver import Connection, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver._verification.payload import parse
from tests.integration.test_sweeper import LEASE, build, dead_claim
from tests.support import PROVIDER, Clock, body_of, signed


def needs_review(rx: Receiver, provider: str = PROVIDER) -> float:
    assert rx.metrics is not None
    value = rx.metrics.registry.get_sample_value(
        "receiver_needs_review_total", {"provider": provider}
    )
    return value or 0.0


async def listed(store: Store, provider: str, webhook_id: str) -> tuple[int, str, list[str]]:
    """What `receiver failed` shows of the receipt (its statement), and its attempts."""
    async with store.acquire() as conn:
        rows = await conn.run_all("list_failed", provider, 100)
        attempts = await ledger_attempts(conn, provider, webhook_id)
    (row,) = [r for r in rows if r["webhook_id"] == webhook_id]
    return int(row["attempts"]), str(row["last_error"]), attempts


async def ledger_attempts(conn: Connection, provider: str, webhook_id: str) -> list[str]:
    rows = await conn.run_all("list_attempts", provider, webhook_id)
    return [r["error"] for r in rows]


@pytest.mark.parametrize("path", ["redelivery", "sweeper"])
async def test_an_interrupted_external_handler_is_counted_and_explained(
    store: Store, path: str
) -> None:
    clock = Clock()
    rx, runs = build(store, clock)  # payment.created: external, no reconcile
    await rx.open()
    body = body_of("payment.created")
    await dead_claim(store, "msg_pay", body, clock.now)  # the process died mid-call
    clock.advance(LEASE + 1)
    if path == "redelivery":
        transport = httpx.ASGITransport(app=rx)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answer = await client.post(
                f"/{PROVIDER}", content=body, headers=signed("msg_pay", body, timestamp=clock.now)
            )
        assert answer.status_code == 202
        assert answer.json()["status"] == "needs_review"
    else:
        assert (await rx.sweep()).failed == 1
    assert runs == []  # never re-run blindly
    assert needs_review(rx) == 1
    attempts, last_error, errors = await listed(store, PROVIDER, "msg_pay")
    assert attempts == 1
    assert "reconcile" in last_error
    assert errors == [last_error]


async def test_a_stale_receipt_of_a_removed_provider_is_counted_and_explained(
    store: Store,
) -> None:
    clock = Clock()
    rx, _ = build(store, clock)
    await rx.open()
    body = body_of("order.created")
    parsed = parse(body, None)
    claim = Claim(Key("gone", "msg_1"), parsed.payload_hash, "order.created", body,
                  clock.now, 1, 3600)  # fmt: skip
    async with store.acquire() as conn:
        await ledger.claim(conn, claim)
    clock.advance(2)
    assert (await rx.sweep()).failed == 1
    assert needs_review(rx, "gone") == 1
    attempts, last_error, errors = await listed(store, "gone", "msg_1")
    assert attempts == 1
    assert "no longer configured" in last_error
    assert errors == [last_error]
