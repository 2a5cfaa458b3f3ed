"""The kit's sender signs like each built-in scheme and drives a real Receiver on both stores,
in-process and over HTTP (a real ``receiver serve`` process)."""

from __future__ import annotations

from pathlib import Path

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
