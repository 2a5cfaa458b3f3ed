"""The kit's sender signs like each built-in scheme and drives a real Receiver on both stores,
in-process and over HTTP (a real ``receiver serve`` process)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from receiver.testing import (
    FakeClock,
    Sender,
    TestStores,
    assert_count,
    assert_executed_once,
    assert_nothing_in_flight,
    assert_replayed,
    count,
)
from tests.servers import running
from tests.support import query
from tests.testing.app import SENDERS, build

ROWS = "SELECT count(*) FROM kit_orders WHERE provider = $1 AND webhook_id = $2"


@pytest.mark.parametrize("provider", sorted(SENDERS))
async def test_each_scheme_in_process(provider: str, kit_stores: TestStores) -> None:
    secret, _, event_type = SENDERS[provider]
    clock = FakeClock()
    rx = build(await kit_stores.fresh(clock), clock)
    async with rx, Sender(rx, provider, secret, clock=clock) as sender:
        webhook = sender.event(event_type, {"order": "o-1"})
        first = await sender.send(webhook)
        assert first.outcome == "executed", first
        clock.advance(30)  # re-signed with a later timestamp: still the same delivery
        twins = await sender.twins(webhook, 8)
        again = await sender.send(webhook)
        assert assert_executed_once([first, *twins, again]) is first
        assert_replayed(first, [again])
        await assert_count(rx.store, 1, ROWS, provider, webhook.id)
        await assert_nothing_in_flight(rx.store)


async def test_svix_default_headers_are_one_delivery_however_named(kit_stores: TestStores) -> None:
    """Svix sends svix-id, svix-timestamp and svix-signature unless the account brands them: the
    Standard Webhooks provider runs such a delivery once, and its retries under either set of
    names are the same delivery. Two different values under the two names are refused."""
    secret, _, event_type = SENDERS["acme"]
    clock = FakeClock()
    rx = build(await kit_stores.fresh(clock), clock)
    async with (
        rx,
        Sender(rx, "acme", secret, scheme="svix", clock=clock) as svix,
        Sender(rx, "acme", secret, clock=clock) as branded,
    ):
        webhook = svix.event(event_type, {"order": "o-1"})
        assert {name for name, _ in svix.headers(webhook)} >= {"svix-id", "svix-signature"}
        first = await svix.send(webhook)
        assert first.outcome == "executed", first
        clock.advance(30)
        twins = await svix.twins(webhook, 4)
        again = await branded.send(webhook)  # the same message under the webhook- names
        assert assert_executed_once([first, *twins, again]) is first
        assert_replayed(first, [again])
        await assert_count(rx.store, 1, ROWS, "acme", webhook.id)

        other = svix.event(event_type, {"order": "o-2"})
        body, headers = svix.attempt(other)
        headers += [("webhook-id", "msg_elsewhere")]
        transport = httpx.ASGITransport(app=rx)
        async with httpx.AsyncClient(transport=transport, base_url="http://rx.test") as client:
            response = await client.post("/acme", content=body, headers=headers)
        assert response.status_code == 400
        assert response.json()["error"] == "duplicate_header:webhook-id"
        assert await count(rx.store, ROWS, "acme", other.id) == 0
        await assert_nothing_in_flight(rx.store)


@pytest.mark.parametrize("provider", sorted(SENDERS))
async def test_a_wrong_secret_is_refused(provider: str, kit_stores: TestStores) -> None:
    _, _, event_type = SENDERS[provider]
    secret = "whsec_" + "A" * 32 if provider.startswith("acme") else "not the secret"
    clock = FakeClock()
    rx = build(await kit_stores.fresh(clock), clock)
    async with rx, Sender(rx, provider, secret, clock=clock) as sender:
        webhook = sender.event(event_type, {"order": "o-1"})
        refused = await sender.send(webhook)
        assert (refused.outcome, refused.status) == ("refused", 401)
        assert await count(rx.store, ROWS, provider, webhook.id) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_each_scheme_over_http(kind: str, pg_url: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'http.db'}" if kind == "sqlite" else pg_url
    if kind == "postgresql":
        await TestStores(tmp_path, pg_url).fresh()  # empty tables
    with running({"RECEIVER_STORE": url}, tmp_path / "server.log", app="tests.testing.app:rx") as s:
        for provider, (secret, scheme, event_type) in sorted(SENDERS.items()):
            async with Sender(s.url, provider, secret, scheme=scheme) as sender:
                webhook = sender.event(event_type, {"order": "o-http"})
                answers = await sender.twins(webhook, 12)
                answers.append(await sender.send(webhook))
                first = assert_executed_once(answers)
                assert_replayed(first, answers[-1:])
            rows = await query(url, ROWS, provider, webhook.id)
            assert rows == [(1,)], (provider, rows)
