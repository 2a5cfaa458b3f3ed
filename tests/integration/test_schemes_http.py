"""Stripe, GitHub, Shopify and Slack deliveries over HTTP through a real Receiver, on SQLite and
PostgreSQL: a valid delivery runs its handler once, a redelivery (fresh timestamp, signed with the
other rotated secret) is a byte-identical replay, and malformed or forged deliveries are refused
with 4xx before anything reaches the ledger."""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from receiver import Connection, Event, Provider, Receiver, Store
from receiver._verification.schemes import (
    GitHub,
    Shopify,
    Slack,
    Stripe,
    sign_github,
    sign_shopify,
    sign_slack,
    sign_stripe,
)
from tests.support import EFFECTS_DDL, Clock, effects, receipt_count

Pairs = list[tuple[str, str]]


@dataclass(frozen=True)
class Scheme:
    """One sender: how to configure it, what it sends, and how it signs."""

    name: str
    old: str
    new: str
    #: The handler pattern registered for its deliveries.
    pattern: str
    #: The event type the handler must see.
    event_type: str
    verifier: Callable[[list[str]], Any]
    body: Callable[[str], bytes]
    #: Signed headers for (body, id, unix seconds, secret).
    sign: Callable[[bytes, str, int, str], Pairs]
    #: The ledger key of (the sender's id, the body): the sender's id.
    key: Callable[[str, bytes], str] = lambda wid, _: wid


def stripe_body(event_id: str) -> bytes:
    return orjson.dumps(
        {"id": event_id, "object": "event", "type": "invoice.paid", "data": {"amount": 4200}}
    )


def github_body(_: str) -> bytes:
    return orjson.dumps({"action": "opened", "issue": {"number": 1347, "title": "Found a bug"}})


def shopify_body(_: str) -> bytes:
    return orjson.dumps({"id": 820982911946154508, "email": "jon@example.com"})


def slack_body(event_id: str) -> bytes:
    return orjson.dumps(
        {
            "type": "event_callback",
            "event_id": event_id,
            "team_id": "T123ABC456",
            "event": {"type": "app_mention", "user": "U123ABC456", "text": "<@U0LAN0Z89> hi"},
        }
    )


def iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")


SCHEMES = [
    Scheme(
        "stripe",
        "whsec_previousSecretStillListed",
        "whsec_currentEndpointSecret",
        "invoice.paid",
        "invoice.paid",
        lambda secrets: Stripe(secrets),
        stripe_body,
        lambda body, _, ts, secret: [("stripe-signature", sign_stripe(secret, ts, body))],
    ),
    Scheme(
        "github",
        "previous github secret",
        "current github secret",
        "issues.*",
        "issues.opened",
        lambda secrets: GitHub(secrets),
        github_body,
        lambda body, wid, _, secret: [
            ("x-hub-signature-256", sign_github(secret, body)),
            ("x-github-delivery", wid),
            ("x-github-event", "issues"),
        ],
    ),
    Scheme(
        "shopify",
        "previous-client-secret",
        "current-client-secret",
        "orders/create",
        "orders/create",
        lambda secrets: Shopify(secrets),
        shopify_body,
        lambda body, wid, ts, secret: [
            ("x-shopify-hmac-sha256", sign_shopify(secret, body)),
            ("x-shopify-webhook-id", "wh-" + wid),
            ("x-shopify-event-id", wid),
            ("x-shopify-topic", "orders/create"),
            ("x-shopify-triggered-at", iso(ts)),
            ("x-shopify-shop-domain", "example.myshopify.com"),
            ("x-shopify-api-version", "2026-10"),
        ],
    ),
    Scheme(
        "slack",
        "8f742231b10e8888abcd99yyyzzz85a5",
        "0a1b2c3d4e5f60718293a4b5c6d7e8f9",
        "app_mention",
        "app_mention",
        lambda secrets: Slack(secrets),
        slack_body,
        lambda body, _, ts, secret: [
            ("x-slack-signature", sign_slack(secret, ts, body)),
            ("x-slack-request-timestamp", str(ts)),
        ],
    ),
]
BY_NAME = {scheme.name: scheme for scheme in SCHEMES}


class App:
    """A Receiver with all four providers; its handlers write one ``effects`` row each."""

    def __init__(self, store: Store) -> None:
        self.clock = Clock()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rx = Receiver(
            store,
            [
                Provider(s.name, verifier=s.verifier([s.old, s.new]), schedule=s.name)
                for s in SCHEMES
            ],
            clock=self.clock,
        )

        @self.rx.on_startup
        async def create_effects(conn: Connection) -> None:
            await conn.execute(EFFECTS_DDL)

        for scheme in SCHEMES:
            self.rx.on(scheme.pattern, provider=scheme.name)(self.handle)

        @self.rx.on("url_verification", provider="slack")
        async def handshake(event: Event, tx: Connection) -> Any:
            return {"challenge": event.payload["challenge"]}

        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.rx), base_url="http://test"
        )

    async def handle(self, event: Event, tx: Connection) -> Any:
        self.calls[(event.provider, event.id)] += 1
        await tx.execute(
            "INSERT INTO effects (provider, webhook_id, fence, note) VALUES ($1, $2, $3, $4)",
            event.provider,
            event.id,
            event.fence,
            event.type,
        )
        return {"provider": event.provider, "id": event.id, "type": event.type}

    @property
    def now(self) -> int:
        return int(self.clock.now)

    async def post(self, provider: str, headers: Pairs, body: bytes) -> httpx.Response:
        headers = [*headers, ("content-type", "application/json")]
        return await self.client.post(f"/{provider}", content=body, headers=headers)


@pytest.fixture
async def app(store: Store) -> AsyncIterator[App]:
    made = App(store)
    await made.rx.open()
    async with made.client:
        yield made


@pytest.mark.parametrize("scheme", SCHEMES, ids=[s.name for s in SCHEMES])
async def test_a_delivery_runs_once_and_its_redelivery_is_replayed(
    app: App, store: Store, scheme: Scheme
) -> None:
    wid = f"{scheme.name}-delivery-1"
    body = scheme.body(wid)
    first = await app.post(scheme.name, scheme.sign(body, wid, app.now, scheme.new), body)
    key = scheme.key(wid, body)
    assert first.status_code == 200, first.text
    assert first.json() == {"provider": scheme.name, "id": key, "type": scheme.event_type}
    assert "idempotent-replayed" not in first.headers

    # The sender retries later: a fresh timestamp, signed with the other listed secret.
    app.clock.advance(120)
    again = await app.post(scheme.name, scheme.sign(body, wid, app.now, scheme.old), body)
    assert again.headers["idempotent-replayed"] == "true"
    assert (again.status_code, again.content, again.headers["content-type"]) == (
        first.status_code,
        first.content,
        first.headers["content-type"],
    )
    assert app.calls == {(scheme.name, key): 1}
    assert await effects(store, key) == 1
    assert await receipt_count(store) == 1
    again = await app.post(scheme.name, scheme.sign(body, wid + "-x", app.now, scheme.new), body)
    if scheme.name in ("stripe", "slack"):
        # The id is signed inside the body: the header's id changes nothing.
        assert again.headers["idempotent-replayed"] == "true"
        assert app.calls == {(scheme.name, key): 1}
    else:
        # GitHub's and Shopify's event id is an unsigned header: another id is another event
        # by default (reported as key drift; Provider(same_content=) can hold or absorb it).
        assert "idempotent-replayed" not in again.headers
        assert app.calls == {(scheme.name, key): 1, (scheme.name, wid + "-x"): 1}


def malformed(scheme: Scheme, now: int) -> list[tuple[str, Pairs, bytes, int, str]]:
    """(label, headers, body, status, check) of deliveries that must never reach the ledger."""
    wid = f"{scheme.name}-bad"
    body = scheme.body(wid)
    good = scheme.sign(body, wid, now, scheme.new)
    signature = good[0]
    cases: list[tuple[str, Pairs, bytes, int, str]] = [
        ("no signature", good[1:], body, 400, f"missing_header:{signature[0]}"),
        ("signature twice", [signature, *good], body, 400, f"duplicate_header:{signature[0]}"),
        ("unknown secret", scheme.sign(body, wid, now, "not-the-secret"), body, 401, "signature"),
        ("tampered body", good, body + b" ", 401, "signature"),
    ]
    if scheme.name == "stripe":
        no_id = b'{"object": "event", "type": "invoice.paid"}'
        cases += [
            ("stale", scheme.sign(body, wid, now - 301, scheme.new), body, 401, "timestamp"),
            ("not hex", [("stripe-signature", f"t={now},v1={'x' * 64}")], body, 400, "signature"),
            ("no event id", scheme.sign(no_id, wid, now, scheme.new), no_id, 400, "event_id"),
        ]
    elif scheme.name == "github":
        cases += [
            ("sha1 only", [("x-hub-signature", "sha1=" + "0" * 40), *good[1:]], body, 400,
             "missing_header:x-hub-signature-256"),
        ]  # fmt: skip
    elif scheme.name == "shopify":
        hex_signature = ("x-shopify-hmac-sha256", "ab" * 32)

        def without(name: str) -> list[tuple[str, str]]:
            return [header for header in good if header[0] != name]

        cases += [
            ("hex signature", [hex_signature, *good[1:]], body, 400, "signature"),
            ("no topic", without("x-shopify-topic"), body, 400, "missing_header:x-shopify-topic"),
            (
                "no shop domain",
                without("x-shopify-shop-domain"),
                body,
                400,
                "missing_header:x-shopify-shop-domain",
            ),
        ]
    else:
        form = b"token=xyz&command=%2Fweather&text=94070"
        cases += [
            ("stale", scheme.sign(body, wid, now - 301, scheme.new), body, 401, "timestamp"),
            ("from the future", scheme.sign(body, wid, now + 301, scheme.new), body, 401,
             "timestamp"),
            ("v1 prefix", [("x-slack-signature", "v1=" + signature[1][3:]), good[1]], body, 400,
             "signature"),
            ("slash command", scheme.sign(form, wid, now, scheme.new), form, 400, "event_id"),
        ]  # fmt: skip
    return cases


@pytest.mark.parametrize("scheme", SCHEMES, ids=[s.name for s in SCHEMES])
async def test_malformed_and_forged_deliveries_never_reach_the_ledger(
    app: App, store: Store, scheme: Scheme
) -> None:
    for label, headers, body, status, check in malformed(scheme, app.now):
        response = await app.post(scheme.name, headers, body)
        assert (response.status_code, response.json()["error"]) == (status, check), label
    assert await receipt_count(store) == 0
    assert not app.calls


async def test_slack_url_verification_is_answered_by_a_handler(app: App, store: Store) -> None:
    slack = BY_NAME["slack"]
    body = orjson.dumps(
        {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    )
    first = await app.post("slack", slack.sign(body, "", app.now, slack.new), body)
    assert first.status_code == 200
    assert first.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    app.clock.advance(5)
    again = await app.post("slack", slack.sign(body, "", app.now, slack.new), body)
    assert (again.content, again.headers["idempotent-replayed"]) == (first.content, "true")
    assert await receipt_count(store) == 1
