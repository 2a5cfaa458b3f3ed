"""Paddle Billing, Zoom, Linear and Twilio deliveries through a real Receiver on SQLite, signed
by the kit's sender: valid (the handler runs once), replayed (a later retry, signed again, gets
the stored answer byte for byte), forged (another secret: 401, nothing stored) and stale (a
signature outside the window: 401, nothing stored; Twilio signs no time, so its replay is
stopped by the ledger alone). Zoom's URL validation goes through the ledger too."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from receiver import Connection, Event, Provider, Receiver, SQLiteStore
from receiver._verification.senders import Linear, Paddle, Zoom, sign_zoom
from receiver._verification.twilio import Twilio
from receiver.testing import FakeClock, Sender
from tests.support import T0, receipt_count

TWILIO_URL = "https://hooks.example.com/webhooks/twilio"
#: provider -> (secret, an event type its sender sends, can a signature go stale?)
SENDERS: dict[str, tuple[str, str, bool]] = {
    "paddle": ("pdl_ntfset_secret_key", "transaction.completed", True),
    "zoom": ("zoom-secret-token", "meeting.started", True),
    "linear": ("lin_wh_signing_secret", "Issue.create", True),
    "twilio": ("twilio-auth-token", "message.delivered", False),
}


class App:
    def __init__(self, store: SQLiteStore, clock: FakeClock) -> None:
        self.zoom = Zoom([SENDERS["zoom"][0]])
        self.rx = Receiver(
            store,
            [
                Provider("paddle", verifier=Paddle([SENDERS["paddle"][0]]), schedule="paddle"),
                Provider("zoom", verifier=self.zoom, schedule="zoom"),
                Provider("linear", verifier=Linear([SENDERS["linear"][0]]), schedule="linear"),
                Provider(
                    "twilio",
                    verifier=Twilio([SENDERS["twilio"][0]], url=TWILIO_URL),
                    schedule="twilio",
                ),
            ],
            clock=clock,
            sweep_interval=None,
        )
        self.runs: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rx.on("*")(self.handle)

        @self.rx.on("endpoint.url_validation", provider="zoom")
        async def validate(event: Event, tx: Connection) -> dict[str, str]:
            return self.zoom.url_validation(event.payload)

    async def handle(self, event: Event, tx: Connection) -> dict[str, Any] | None:
        if event.type == "endpoint.url_validation":
            return None  # answered by its own handler
        self.runs[(event.provider, event.id)] += 1
        return {"id": event.id, "type": event.type}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def app(sqlite_store: SQLiteStore, clock: FakeClock) -> AsyncIterator[App]:
    made = App(sqlite_store, clock)
    async with made.rx:
        yield made


@pytest.mark.parametrize("provider", sorted(SENDERS))
async def test_valid_then_replayed(app: App, clock: FakeClock, provider: str) -> None:
    secret, event_type, _ = SENDERS[provider]
    async with Sender(app.rx, provider, secret, clock=clock) as sender:
        webhook = sender.event(event_type, {"id": "obj_1"})
        first = await sender.send(webhook)
        clock.advance(60 * 60)  # the sender's retry, an hour later, signed again
        again = await sender.send(webhook)
    assert first.outcome == "executed", first
    assert orjson.loads(first.body) == {"id": webhook.id, "type": event_type}
    assert again.replayed
    assert again.answer == first.answer
    assert app.runs == {(provider, webhook.id): 1}


@pytest.mark.parametrize("provider", sorted(SENDERS))
async def test_forged_is_refused_and_nothing_is_stored(
    app: App, clock: FakeClock, provider: str, sqlite_store: SQLiteStore
) -> None:
    _, event_type, _ = SENDERS[provider]
    async with Sender(app.rx, provider, "not-the-secret", clock=clock) as forger:
        answer = await forger.send(forger.event(event_type, {"id": "obj_2"}))
    assert answer.status == 401
    assert orjson.loads(answer.body)["error"] == "signature"
    assert not app.runs
    assert await receipt_count(sqlite_store) == 0


@pytest.mark.parametrize("provider", sorted(p for p, (_, _, timed) in SENDERS.items() if timed))
async def test_stale_is_refused_and_nothing_is_stored(
    app: App, clock: FakeClock, provider: str, sqlite_store: SQLiteStore
) -> None:
    secret, event_type, _ = SENDERS[provider]
    past = FakeClock(T0 - 600)  # a captured attempt, sent again ten minutes later
    async with Sender(app.rx, provider, secret, clock=past) as replayer:
        answer = await replayer.send(replayer.event(event_type, {"id": "obj_3"}))
    assert answer.status == 401
    assert orjson.loads(answer.body)["error"] == "timestamp"
    assert await receipt_count(sqlite_store) == 0


async def test_twilio_has_no_clock_so_a_captured_request_is_stopped_by_the_ledger(
    app: App, clock: FakeClock
) -> None:
    secret, event_type, _ = SENDERS["twilio"]
    async with Sender(app.rx, "twilio", secret, clock=clock) as sender:
        webhook = sender.event(event_type, {"Body": "hello"})
        body, headers = sender.attempt(webhook)
        first = await sender.send(webhook)
        clock.advance(3600)
        replayed = await app.rx.deliver("twilio", dict(headers), body)
    assert first.outcome == "executed"
    assert replayed.headers.get("idempotent-replayed") == "true"
    assert app.runs == {("twilio", webhook.id): 1}


async def test_zoom_url_validation_is_answered_through_the_ledger(
    app: App, clock: FakeClock
) -> None:
    secret = SENDERS["zoom"][0]
    body = orjson.dumps(
        {"event": "endpoint.url_validation", "event_ts": 1, "payload": {"plainToken": "abc"}}
    )
    ts = int(clock())
    headers = {
        "x-zm-signature": sign_zoom(secret, ts, body),
        "x-zm-request-timestamp": str(ts),
        "content-type": "application/json",
    }
    answer = await app.rx.deliver("zoom", headers, body)
    assert answer.status_code == 200
    assert orjson.loads(answer.body) == app.zoom.url_validation({"plainToken": "abc"})
    assert not app.runs


async def test_a_twilio_provider_can_dedup_on_a_form_parameter(
    sqlite_store: SQLiteStore, clock: FakeClock
) -> None:
    secret = SENDERS["twilio"][0]
    verifier = Twilio([secret], url=TWILIO_URL)
    rx = Receiver(
        sqlite_store, [Provider("twilio", verifier=verifier, dedup_key="MessageSid")], clock=clock
    )
    runs: list[str] = []

    @rx.on("message.*")
    async def message(event: Event, tx: Connection) -> None:
        runs.append(event.id)

    async with rx, Sender(rx, "twilio", secret, clock=clock) as sender:
        first = sender.event("message.delivered", {"MessageSid": "SM42"})
        # A second request for the same message under a new idempotency token.
        again = sender.event("message.delivered", {"MessageSid": "SM42"})
        answers = [await sender.send(first), await sender.send(again)]
    assert [a.status for a in answers] == [200, 200]
    assert answers[1].replayed
    assert runs == ["SM42"]
