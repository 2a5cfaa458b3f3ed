"""Linear's ``webhookTimestamp`` (its time of the attempt, inside the signed body) is left out
of Linear's payload fingerprints only: for every other provider, on SQLite and PostgreSQL's
two layouts, two payloads that differ in a field of that name are two payloads (422 under one
key), and a Linear retry with a refreshed timestamp is still its first attempt's replay."""

from __future__ import annotations

import collections

import orjson

from receiver import Connection, Event, Linear, Provider, Receiver, Store, sign_linear
from tests.support import SECRET, T0, Clock, signed


def build(store: Store, clock: Clock) -> tuple[Receiver, collections.Counter[str]]:
    rx = Receiver(
        store,
        [Provider("acme", [SECRET]), Provider("linear", verifier=Linear([SECRET]))],
        clock=clock,
        sweep_interval=None,
    )
    runs: collections.Counter[str] = collections.Counter()

    @rx.on("*")
    async def record(event: Event, tx: Connection) -> dict[str, object]:
        runs[event.provider] += 1
        return {"seen": event.payload["webhookTimestamp"]}

    return rx, runs


async def test_only_linear_drops_its_attempt_field(store: Store) -> None:
    clock = Clock(T0)
    rx, runs = build(store, clock)
    async with rx:
        # A Standard Webhooks sender whose payload has a field named webhookTimestamp: two
        # values under one webhook-id are two payloads, a mismatch, never a replay.
        first = orjson.dumps({"type": "order.paid", "webhookTimestamp": 1})
        other = orjson.dumps({"type": "order.paid", "webhookTimestamp": 2})
        answers = [
            await rx.deliver("acme", signed("msg_1", body, timestamp=clock()), body)
            for body in (first, other)
        ]
        # Linear refreshes it on every attempt: its retry is the first attempt's replay.
        linear = []
        for _ in range(2):
            body = orjson.dumps(
                {"type": "Issue", "action": "create", "data": {"id": "i1"},
                 "webhookTimestamp": int(clock() * 1000)}
            )  # fmt: skip
            linear.append(
                await rx.deliver("linear", {"linear-signature": sign_linear(SECRET, body)}, body)
            )
            clock.advance(10)
    assert [a.status_code for a in answers] == [200, 422]
    assert [a.status_code for a in linear] == [200, 200]
    assert linear[1].headers["idempotent-replayed"] == "true"
    assert linear[1].body == linear[0].body
    assert runs == {"acme": 1, "linear": 1}
