"""Where the dedup key comes from, on SQLite and PostgreSQL: a sender that mints a new
``webhook-id`` on every retry runs its handler once when the provider dedups on a payload path
(and twice without one: the reason for the option); two routes of one sender keep independent
keys; the fingerprint check (same key, other payload: 422) holds for a payload key and for a
key function; a payload without the key's value is refused before anything is stored."""

from __future__ import annotations

import collections
from typing import Any

import orjson
import pytest

from receiver import Connection, Event, Provider, Receiver, StandardWebhooks, Store, sign
from tests.support import SECRET, T0, Clock, receipt_count


def supabase_body(record_id: int, committed: str, name: str = "Ada") -> bytes:
    # The shape of a database-change event (a sender such as Supabase's database webhooks).
    return orjson.dumps(
        {
            "type": "INSERT",
            "table": "customers",
            "record": {"id": record_id, "name": name},
            "commit_timestamp": committed,
        }
    )


def attempt(webhook_id: str, body: bytes, now: float) -> dict[str, str]:
    ts = int(now)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(SECRET, webhook_id, ts, body),
        "content-type": "application/json",
    }


def build(store: Store, clock: Clock, *providers: Provider) -> tuple[Receiver, Any]:
    rx = Receiver(store, list(providers), clock=clock, sweep_interval=None)
    runs: collections.Counter[tuple[str, str]] = collections.Counter()

    @rx.on("INSERT")
    async def insert(event: Event, tx: Connection) -> dict[str, Any]:
        runs[(event.provider, event.id)] += 1
        return {"customer": event.payload["record"]["id"]}

    return rx, runs


async def test_a_new_webhook_id_on_every_retry_runs_once_with_a_payload_key(store: Store) -> None:
    clock = Clock(T0)
    keyed = Provider("keyed", [SECRET], dedup_key=["record.id", "commit_timestamp"])
    plain = Provider("plain", [SECRET])
    rx, runs = build(store, clock, keyed, plain)
    body = supabase_body(42, "2026-05-01T10:00:00.123Z")
    async with rx:
        answers = []
        for n in range(4):  # the first attempt and three retries, each under a fresh id
            answers.append(await rx.deliver("keyed", attempt(f"msg_new_{n}", body, clock()), body))
            await rx.deliver("plain", attempt(f"msg_new_{n}", body, clock()), body)
            clock.advance(300)
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.headers.get("idempotent-replayed") for a in answers] == [None, "true", "true", "true"]
    assert {a.body for a in answers} == {b'{"customer":42}'}
    assert runs[("keyed", "42|2026-05-01T10:00:00.123Z")] == 1
    assert sum(n for (p, _), n in runs.items() if p == "keyed") == 1
    assert sum(n for (p, _), n in runs.items() if p == "plain") == 4  # the header dedups nothing


async def test_two_routes_of_one_sender_keep_independent_keys(store: Store) -> None:
    clock = Clock(T0)
    verifier = StandardWebhooks([SECRET])  # one sender, one secret, two endpoints
    orders = Provider("orders", verifier=verifier, dedup_key="record.id")
    billing = Provider("billing", verifier=verifier, dedup_key="record.id")
    rx, runs = build(store, clock, orders, billing)
    body = supabase_body(7, "2026-05-01T10:00:00Z")
    other = supabase_body(7, "2026-05-01T10:00:00Z", name="Grace")
    async with rx:
        first = await rx.deliver("orders", attempt("msg_1", body, clock()), body)
        second = await rx.deliver("billing", attempt("msg_1", body, clock()), body)
        # Each route's key has its own fingerprint: another payload is refused on the route
        # that has seen the key, and on that route only.
        mismatch = await rx.deliver("orders", attempt("msg_2", other, clock()), other)
        again = await rx.deliver("billing", attempt("msg_3", body, clock()), body)
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.headers.get("idempotent-replayed") is None  # ran: not the other route's
    assert runs == {("orders", "7"): 1, ("billing", "7"): 1}
    assert mismatch.status_code == 422
    assert again.headers.get("idempotent-replayed") == "true"
    assert await receipt_count(store) == 2


async def test_the_fingerprint_check_holds_for_a_key_function(store: Store) -> None:
    clock = Clock(T0)

    def key(delivered: Any) -> tuple[object, ...]:
        return (delivered.payload["table"], delivered.payload["record"]["id"])

    rx, runs = build(store, clock, Provider("fn", [SECRET], dedup_key=key))
    body = supabase_body(9, "t1")
    changed = supabase_body(9, "t1", name="Changed")
    async with rx:
        ok = await rx.deliver("fn", attempt("msg_a", body, clock()), body)
        bad = await rx.deliver("fn", attempt("msg_b", changed, clock()), changed)
        replay = await rx.deliver("fn", attempt("msg_c", body, clock()), body)
    assert ok.status_code == 200
    assert bad.status_code == 422
    assert orjson.loads(bad.body)["error"] == "payload_mismatch"
    assert replay.headers.get("idempotent-replayed") == "true"
    assert runs == {("fn", "customers|9"): 1}


@pytest.mark.parametrize(
    "body",
    [
        b'{"type": "INSERT", "record": null}',  # a DELETE's record, say: no id to key on
        b'{"type": "INSERT", "record": {"id": 1.5}, "commit_timestamp": "t"}',
        b'{"type": "INSERT", "record": {"id": {"nested": 1}}, "commit_timestamp": "t"}',
        b"[1, 2]",
    ],
)
async def test_a_payload_without_the_keys_value_is_refused_and_nothing_is_stored(
    store: Store, body: bytes
) -> None:
    clock = Clock(T0)
    rx, runs = build(store, clock, Provider("keyed", [SECRET], dedup_key="record.id"))
    async with rx:
        answer = await rx.deliver("keyed", attempt("msg_x", body, clock()), body)
    assert answer.status_code == 400
    assert orjson.loads(answer.body)["error"] == "dedup_key"
    assert b"1.5" not in answer.body  # the payload's values never reach the answer
    assert not runs
    assert await receipt_count(store) == 0


async def test_a_raising_key_function_is_a_refusal_not_a_500(store: Store) -> None:
    clock = Clock(T0)

    def key(delivered: Any) -> str:
        return str(delivered.payload["missing"]["secret-value"])

    rx, _ = build(store, clock, Provider("fn", [SECRET], dedup_key=key))
    body = supabase_body(1, "t")
    async with rx:
        answer = await rx.deliver("fn", attempt("msg_y", body, clock()), body)
    assert answer.status_code == 400
    assert orjson.loads(answer.body) == {
        "error": "dedup_key",
        "detail": "the dedup key function raised KeyError",
    }
    assert await receipt_count(store) == 0


async def test_a_forged_delivery_is_refused_before_its_key_is_read(store: Store) -> None:
    clock = Clock(T0)
    rx, runs = build(store, clock, Provider("keyed", [SECRET], dedup_key="record.id"))
    body = supabase_body(3, "t")
    forged = attempt("msg_f", body, clock())
    forged["webhook-signature"] = sign("whsec_" + "QUJD" * 8, "msg_f", int(clock()), body)
    async with rx:
        answer = await rx.deliver("keyed", forged, body)
    assert answer.status_code == 401
    assert not runs
    assert await receipt_count(store) == 0
