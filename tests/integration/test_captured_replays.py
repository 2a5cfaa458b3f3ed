"""A captured delivery re-sent by someone else, on SQLite and PostgreSQL. Linear's key is made
from its signed payload: whatever Linear-Delivery the replayer writes, the handler runs once.
Twilio's key is its unsigned I-Twilio-Idempotency-Token (two genuine requests can carry the
same parameters): a capture under a new token is reported as key drift, and runs once where the
provider absorbs the same content under a new id (tests/integration/test_event_ids.py)."""

from __future__ import annotations

import collections
import urllib.parse

import orjson

from receiver import (
    Connection,
    Event,
    Linear,
    Provider,
    Receiver,
    Store,
    Twilio,
    sign_linear,
    sign_twilio,
)
from tests.support import SECRET, T0, Clock, receipt_count

URL = "https://example.com/webhooks/twilio"


def build(store: Store, clock: Clock) -> tuple[Receiver, collections.Counter[str]]:
    twilio = Twilio([SECRET], url=URL)
    rx = Receiver(
        store,
        [
            Provider("twilio", verifier=twilio, schedule="twilio", same_content="absorb"),
            Provider("linear", verifier=Linear([SECRET])),
        ],
        clock=clock,
        sweep_interval=None,
    )
    runs: collections.Counter[str] = collections.Counter()

    @rx.on("*")
    async def record(event: Event, tx: Connection) -> dict[str, str]:
        runs[event.provider] += 1
        return {"ran": event.type}

    return rx, runs


async def test_a_twilio_capture_under_a_new_token_runs_once(store: Store) -> None:
    clock = Clock(T0)
    rx, runs = build(store, clock)
    params = [("MessageSid", "SM1"), ("MessageStatus", "delivered"), ("AccountSid", "AC1")]
    body = urllib.parse.urlencode(params).encode()
    signature = sign_twilio(SECRET, URL, params)
    async with rx:
        answers = []
        for token in ("idem-genuine", "idem-genuine", "idem-replayed-1", "idem-replayed-2"):
            headers = {
                "x-twilio-signature": signature,
                "i-twilio-idempotency-token": token,
                "content-type": "application/x-www-form-urlencoded",
            }
            answers.append(await rx.deliver("twilio", headers, body))
            clock.advance(86_400)  # Twilio signs no time: a capture replays days later
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.headers.get("idempotent-replayed") for a in answers] == [None] + ["true"] * 3
    assert runs == {"twilio": 1}
    assert await receipt_count(store) == 3  # one per token, two absorbed
    # The same signed content under two new tokens: two key-drift alerts, both absorbed.
    assert rx.metrics is not None
    drift = rx.metrics.registry.get_sample_value("receiver_key_drift_total", {"provider": "twilio"})
    assert drift == 2


async def test_a_linear_capture_under_a_new_delivery_id_runs_once(store: Store) -> None:
    clock = Clock(T0)
    rx, runs = build(store, clock)
    payload = {"type": "Issue", "action": "create", "data": {"id": "i1"}}
    async with rx:
        answers = []
        for delivery in ("d-genuine", "d-replayed", "d-other"):
            body = orjson.dumps({**payload, "webhookTimestamp": int(clock() * 1000)})
            headers = {"linear-signature": sign_linear(SECRET, body), "linear-delivery": delivery}
            answers.append(await rx.deliver("linear", headers, body))
            clock.advance(30)  # inside Linear's one-minute window
    assert [a.status_code for a in answers] == [200] * 3
    assert [a.headers.get("idempotent-replayed") for a in answers] == [None, "true", "true"]
    assert runs == {"linear": 1}
    assert await receipt_count(store) == 1
