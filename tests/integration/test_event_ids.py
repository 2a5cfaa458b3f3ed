"""Senders whose event id is an unsigned header (GitHub, Shopify, Twilio) are keyed on it, on
SQLite and on PostgreSQL's two layouts: two genuine events with the same body are never merged
(Shopify fires products/create and products/update for one change), a genuine retry lands on
its first key and is replayed, the same content under a new id is reported (key drift: alert,
metric, console) and held or absorbed where the provider opts in, and receipts stored under
the body-digest keys of earlier releases keep answering their events' redeliveries."""

from __future__ import annotations

import asyncio
import collections
import logging
import urllib.parse
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receiver import (
    Connection,
    Event,
    GitHub,
    Provider,
    Receiver,
    Shopify,
    Store,
    Twilio,
    sign_github,
    sign_shopify,
    sign_twilio,
)
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key, StoredResponse
from receiver._verification.ids import body_key
from receiver._verification.payload import parse
from tests.integration.test_queued import drain
from tests.support import SECRET, T0, Clock, receipt_count

URL = "https://example.com/webhooks/twilio"
PRODUCT = orjson.dumps({"id": 632910392, "title": "IPod Nano - 8GB", "status": "active"})
ISSUE = orjson.dumps({"action": "opened", "issue": {"number": 1347}})


def build(
    store: Store, clock: Clock, *, same_content: Any = "run"
) -> tuple[Receiver, collections.Counter[tuple[str, str, str]]]:
    rx = Receiver(
        store,
        [
            Provider("shopify", verifier=Shopify([SECRET]), same_content=same_content),
            Provider("github", verifier=GitHub([SECRET]), same_content=same_content),
            Provider("twilio", verifier=Twilio([SECRET], url=URL), same_content=same_content),
        ],
        clock=clock,
        sweep_interval=None,
    )
    runs: collections.Counter[tuple[str, str, str]] = collections.Counter()

    @rx.on("*")
    async def record(event: Event, tx: Connection) -> dict[str, str]:
        runs[(event.provider, event.id, event.type)] += 1
        return {"ran": event.type, "id": event.id}

    return rx, runs


def shopify(
    event_id: str, topic: str, body: bytes = PRODUCT, webhook_id: str = ""
) -> dict[str, str]:
    return {
        "x-shopify-hmac-sha256": sign_shopify(SECRET, body),
        "x-shopify-topic": topic,
        "x-shopify-event-id": event_id,
        "x-shopify-webhook-id": webhook_id or f"wh-{event_id}-{topic}",
        "x-shopify-triggered-at": "2026-12-08T00:00:00Z",
        "x-shopify-shop-domain": "example.myshopify.com",
        "x-shopify-api-version": "2026-10",
        "content-type": "application/json",
    }


def github(delivery: str, body: bytes = ISSUE, event: str = "issues") -> dict[str, str]:
    return {
        "x-hub-signature-256": sign_github(SECRET, body),
        "x-github-delivery": delivery,
        "x-github-event": event,
        "content-type": "application/json",
    }


GATHER = [("CallSid", "CA1"), ("Digits", "1"), ("AccountSid", "AC1"), ("CallStatus", "in-progress")]


def twilio(token: str, params: list[tuple[str, str]] = GATHER) -> dict[str, str]:
    return {
        "x-twilio-signature": sign_twilio(SECRET, URL, params),
        "i-twilio-idempotency-token": token,
        "content-type": "application/x-www-form-urlencoded",
    }


def form(params: list[tuple[str, str]] = GATHER) -> bytes:
    return urllib.parse.urlencode(params).encode()


def drift(rx: Receiver, provider: str) -> float:
    assert rx.metrics is not None
    value = rx.metrics.registry.get_sample_value("receiver_key_drift_total", {"provider": provider})
    return value or 0.0


async def test_one_shopify_change_fires_two_topics_and_both_run(store: Store) -> None:
    """The issue's case: products/create and products/update of one change, the same body,
    two X-Shopify-Event-Id values. Both handlers run; each topic's retry is replayed."""
    clock = Clock(T0)
    rx, runs = build(store, clock)
    async with rx:
        created = await rx.deliver("shopify", shopify("e-1", "products/create"), PRODUCT)
        updated = await rx.deliver("shopify", shopify("e-2", "products/update"), PRODUCT)
        clock.advance(5)
        retried = await rx.deliver("shopify", shopify("e-2", "products/update"), PRODUCT)
    assert [r.status_code for r in (created, updated, retried)] == [200, 200, 200]
    assert "idempotent-replayed" not in updated.headers
    assert retried.headers["idempotent-replayed"] == "true"
    assert retried.body == updated.body
    assert runs == {
        ("shopify", "e-1", "products/create"): 1,
        ("shopify", "e-2", "products/update"): 1,
    }
    assert await receipt_count(store) == 2
    # Another topic's content is another event: not key drift.
    assert drift(rx, "shopify") == 0


async def test_two_subscriptions_of_one_shopify_event_run_it_once(store: Store) -> None:
    """Shopify's documented duplicate: one event (one X-Shopify-Event-Id) delivered by two
    subscriptions, each with its own X-Shopify-Webhook-Id."""
    rx, runs = build(store, Clock(T0))
    async with rx:
        first = await rx.deliver(
            "shopify", shopify("e-1", "orders/create", webhook_id="w-a"), PRODUCT
        )
        second = await rx.deliver(
            "shopify", shopify("e-1", "orders/create", webhook_id="w-b"), PRODUCT
        )
    assert second.headers["idempotent-replayed"] == "true"
    assert second.body == first.body
    assert runs == {("shopify", "e-1", "orders/create"): 1}


async def test_github_events_with_one_body_are_two_events_and_a_redelivery_replays(
    store: Store,
) -> None:
    clock = Clock(T0)
    rx, runs = build(store, clock)
    async with rx:
        first = await rx.deliver("github", github("guid-1"), ISSUE)
        other = await rx.deliver("github", github("guid-2"), ISSUE)
        clock.advance(3600)  # a redelivery from GitHub's UI keeps the GUID
        again = await rx.deliver("github", github("guid-1"), ISSUE)
    assert "idempotent-replayed" not in other.headers
    assert (again.headers["idempotent-replayed"], again.body) == ("true", first.body)
    assert runs == {
        ("github", "guid-1", "issues.opened"): 1,
        ("github", "guid-2", "issues.opened"): 1,
    }
    # The same signed content under a second GUID in the window: reported, once.
    assert drift(rx, "github") == 1


async def test_twilio_gathers_the_same_digits_twice_and_both_run(store: Store) -> None:
    """Two genuine requests with the same parameters (the caller pressed 1, then 1 again):
    two tokens, two events. Twilio's retry keeps its token and is replayed."""
    rx, runs = build(store, Clock(T0))
    async with rx:
        answers = [
            await rx.deliver("twilio", twilio(token), form())
            for token in ("idem-1", "idem-2", "idem-2")
        ]
    assert [a.headers.get("idempotent-replayed") for a in answers] == [None, None, "true"]
    assert runs == {
        ("twilio", "idem-1", "call.in-progress"): 1,
        ("twilio", "idem-2", "call.in-progress"): 1,
    }


async def test_the_same_content_under_a_new_id_is_reported(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Run by default (it may be a genuine event), with the alert, the metric and the
    console's receipt page saying that the content was already there under another id."""
    rx, runs = build(store, Clock(T0))
    async with rx:
        await rx.deliver("github", github("guid-1"), ISSUE)
        with caplog.at_level(logging.WARNING, logger="receiver"):
            await rx.deliver("github", github("guid-replayed"), ISSUE)
        console = rx.console()
        transport = httpx.ASGITransport(app=console)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            page = await client.get(
                "/receipt", params={"provider": "github", "id": "guid-replayed"}
            )
            first = await client.get("/receipt", params={"provider": "github", "id": "guid-1"})
    assert len(runs) == 2
    assert drift(rx, "github") == 1
    assert any("ALERT: key drift" in r.getMessage() for r in caplog.records)
    assert page.status_code == 200, page.text
    for shown, other in ((page, "guid-1"), (first, "guid-replayed")):
        assert "key drift" in shown.text
        assert other in shown.text


@pytest.mark.parametrize("policy", ["absorb", "hold"])
async def test_opted_in_the_same_content_under_a_new_id_does_not_run(
    store: Store, policy: str
) -> None:
    """same_content="absorb": answered with the first receipt's stored answer; "hold": 202
    held, needing review, the handler not run (an operator's replay runs it). Genuine retries
    and other content still run once, and another topic's same body is not held."""
    clock = Clock(T0)
    rx, runs = build(store, clock, same_content=policy)
    async with rx:
        first = await rx.deliver("twilio", twilio("idem-1"), form())
        clock.advance(86_400)  # Twilio signs no time: a capture replays days later
        resent = await rx.deliver("twilio", twilio("idem-captured"), form())
        again = await rx.deliver("twilio", twilio("idem-captured"), form())
        topics = [
            await rx.deliver("shopify", shopify("e-1", "products/create"), PRODUCT),
            await rx.deliver("shopify", shopify("e-2", "products/update"), PRODUCT),
        ]
        async with store.acquire() as conn:
            held = await ledger.lookup(conn, Key("twilio", "idem-captured"))
    assert runs == {
        ("twilio", "idem-1", "call.in-progress"): 1,
        ("shopify", "e-1", "products/create"): 1,
        ("shopify", "e-2", "products/update"): 1,
    }
    assert [t.status_code for t in topics] == [200, 200]
    assert drift(rx, "twilio") == 1
    assert held is not None
    if policy == "absorb":
        assert (resent.status_code, resent.body) == (200, first.body)
        assert resent.headers["idempotent-replayed"] == "true"
        assert held.state is ledger.State.COMPLETED
    else:
        assert resent.status_code == 202
        assert orjson.loads(resent.body)["status"] == "held"
        assert held.state is ledger.State.FAILED
        assert "idem-1" in (held.last_error or "")
    # The sender's own retry of the held or absorbed delivery gets the same answer.
    assert (again.status_code, again.body) == (resent.status_code, resent.body)


async def test_absorbing_waits_for_the_first_to_finish(store: Store) -> None:
    """The same content under a new id while the first delivery's handler still runs: 409, so
    that the sender retries; its retry, once the first finished, is absorbed."""
    rx = Receiver(
        store,
        [Provider("github", verifier=GitHub([SECRET]), same_content="absorb")],
        clock=Clock(T0),
        sweep_interval=None,
    )
    running, release = asyncio.Event(), asyncio.Event()
    runs: collections.Counter[str] = collections.Counter()

    @rx.on("*")
    async def slow(event: Event, tx: Connection) -> dict[str, str]:
        runs[event.id] += 1
        running.set()
        await release.wait()
        return {"ran": event.id}

    async with rx:
        first = asyncio.create_task(rx.deliver("github", github("guid-1"), ISSUE))
        await running.wait()
        busy = await rx.deliver("github", github("guid-2"), ISSUE)
        release.set()
        done = await first
        retried = await rx.deliver("github", github("guid-2"), ISSUE)
    assert busy.status_code == 409
    assert "retry-after" in busy.headers
    assert (retried.status_code, retried.body) == (200, done.body)
    assert retried.headers["idempotent-replayed"] == "true"
    assert runs == {"guid-1": 1}


async def test_absorbing_never_waits_on_a_delivery_given_back(store: Store) -> None:
    """The first delivery fails (released for its sender's retry) after the copy under a new id
    was told to come back: the copy's retry runs (nothing else will answer it), and the first
    one's retry is then absorbed. Neither waits on the other for ever."""
    rx = Receiver(
        store,
        [Provider("github", verifier=GitHub([SECRET]), same_content="absorb")],
        clock=Clock(T0),
        sweep_interval=None,
    )
    running, release = asyncio.Event(), asyncio.Event()
    runs: collections.Counter[str] = collections.Counter()

    @rx.on("*")
    async def flaky(event: Event, tx: Connection) -> dict[str, str]:
        runs[event.id] += 1
        if event.id == "guid-1" and runs[event.id] == 1:
            running.set()
            await release.wait()
            raise RuntimeError("the downstream is down")
        return {"ran": event.id}

    async with rx:
        first = asyncio.create_task(rx.deliver("github", github("guid-1"), ISSUE))
        await running.wait()
        busy = await rx.deliver("github", github("guid-2"), ISSUE)
        release.set()
        failed = await first
        copy = await rx.deliver("github", github("guid-2"), ISSUE)
        retried = await rx.deliver("github", github("guid-1"), ISSUE)
    assert [busy.status_code, failed.status_code, copy.status_code] == [409, 500, 200]
    assert (retried.body, retried.headers["idempotent-replayed"]) == (copy.body, "true")
    assert runs == {"guid-1": 1, "guid-2": 1}


async def test_same_content_is_checked_at_start_up() -> None:
    from receiver import ConfigurationError

    with pytest.raises(ConfigurationError, match="same_content must be 'run'"):
        Provider("gh", verifier=GitHub([SECRET]), same_content="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="applies to inline"):
        Provider("gh", verifier=GitHub([SECRET]), same_content="hold", mode="queued")


async def write_the_old_way(
    store: Store, provider: str, body: bytes, event_type: str, key: str | None = None
) -> str:
    """A completed receipt as releases that keyed these schemes on the body stored it."""
    key = key or body_key(body)
    parsed = parse(body, event_type)
    claim = Claim(Key(provider, key), parsed.payload_hash, event_type, body, None, 60.0, 86_400.0)
    async with store.acquire() as conn:
        got = await ledger.claim(conn, claim)
        assert isinstance(got, ledger.Claimed)
        answer = StoredResponse(200, "application/json", b'{"ran":"before the upgrade"}')
        await ledger.complete(conn, claim.key, got.fence, answer, None)
    return key


@pytest.mark.parametrize("mode", ["inline", "queued"])
async def test_receipts_of_earlier_releases_keep_answering(store: Store, mode: str) -> None:
    """A redelivery of an event received before its scheme keyed on the event id is answered
    from the receipt stored under the body digest, on every path (live, either mode, and
    enqueue_many); a new event, or the same body under another topic, runs."""
    await write_the_old_way(store, "github", ISSUE, "issues.opened")
    await write_the_old_way(store, "shopify", PRODUCT, "products/create")
    twilio_key = Twilio([SECRET], url=URL).legacy_key(form())
    await write_the_old_way(store, "twilio", form(), "call.in-progress", twilio_key)
    rx = Receiver(
        store,
        [
            Provider("github", verifier=GitHub([SECRET]), mode=mode),
            Provider("shopify", verifier=Shopify([SECRET]), mode=mode),
            Provider("twilio", verifier=Twilio([SECRET], url=URL), mode=mode),
        ],
        clock=Clock(T0),
        sweep_interval=None,
    )
    runs: collections.Counter[tuple[str, str]] = collections.Counter()

    @rx.on("*")
    async def record(event: Event, tx: Connection) -> None:
        runs[(event.provider, event.type)] += 1

    async with rx:
        old = [
            await rx.deliver("github", github("guid-before"), ISSUE),
            await rx.deliver("shopify", shopify("e-before", "products/create"), PRODUCT),
            await rx.deliver("twilio", twilio("idem-before"), form()),
        ]
        # A backfill (enqueue_many reads the type from the body) of an event a backfill of
        # an earlier release queued: found under its old key, not queued again.
        typed = orjson.dumps({"type": "issues.opened", "issue": {"number": 7}})
        await write_the_old_way(store, "github", typed, "issues.opened")
        backfilled = await rx.enqueue_many("github", [("guid-backfilled", typed)])
        update = await rx.deliver("shopify", shopify("e-update", "products/update"), PRODUCT)
        if mode == "queued":
            await drain(rx)
    assert [o.body for o in old] == [b'{"ran":"before the upgrade"}'] * 3
    assert all(o.headers["idempotent-replayed"] == "true" for o in old)
    assert backfilled == [False]
    assert update.status_code in (200, 202)
    assert runs == {("shopify", "products/update"): 1}


async def test_no_receipt_of_an_earlier_release_costs_no_lookup_per_delivery(
    store: Store,
) -> None:
    """The transition ends by itself: with no body-digest receipt in the ledger, the horizon
    is read once and no delivery looks an earlier key up."""
    rx, runs = build(store, Clock(T0))
    async with rx:
        await rx.deliver("github", github("guid-1"), ISSUE)
        assert rx.pipeline.legacy._until["github"] == float("-inf")
        closed = b'{"action": "closed"}'
        await rx.deliver("github", github("guid-2", closed), closed)
    assert len(runs) == 2


# -- the property ------------------------------------------------------------------------------

BODIES = [PRODUCT, ISSUE, b'{"action": "closed"}']
TOPICS = ["products/create", "products/update"]
SENDERS = ["shopify", "github", "twilio"]


def genuine(sender: str, event_id: str, body: bytes, topic: str) -> tuple[dict[str, str], bytes]:
    """One attempt of a genuine event, as its sender sends every attempt of it."""
    if sender == "shopify":
        return shopify(event_id, topic, body), body
    if sender == "github":
        return github(event_id, body, topic.partition("/")[2]), body
    params = [("CallSid", "CA1"), ("Digits", str(len(body) % 3)), ("CallStatus", topic[-6:])]
    return twilio(event_id, params), form(params)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(SENDERS),
            st.sampled_from(BODIES),
            st.sampled_from(TOPICS),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=8,
    ),
    order=st.randoms(use_true_random=False),
)
async def test_distinct_events_never_merge_and_retries_never_run_twice(
    store: Store, events: list[tuple[str, bytes, str, int]], order: Any
) -> None:
    """Whatever the senders, bodies and types (the same ones often), however often each event
    is retried and in whatever order: every genuine event runs exactly once."""
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_receipts")
    rx, runs = build(store, Clock(T0))
    sends = [(n, sender, body, topic) for n, (sender, body, topic, times) in enumerate(events)
             for _ in range(times)]  # fmt: skip
    order.shuffle(sends)
    async with rx:
        for n, sender, body, topic in sends:
            headers, sent = genuine(sender, f"e-{n}", body, topic)
            answer = await rx.deliver(sender, headers, sent)
            assert answer.status_code == 200
    ran = collections.Counter((provider, event_id) for provider, event_id, _ in runs.elements())
    assert ran == {(sender, f"e-{n}"): 1 for n, (sender, _, _, _) in enumerate(events)}


async def test_racing_copies_of_one_event_run_it_once(store: Store) -> None:
    """50 concurrent copies of one Shopify event (one event id, each copy from another
    subscription) released through one barrier, beside 10 copies of another topic's event with
    the same body: each event runs once, every other copy is a replay or a 409."""
    rx, runs = build(store, Clock(T0))
    copies = [shopify("e-1", "products/create", webhook_id=f"w-{n}") for n in range(50)]
    copies += [shopify("e-2", "products/update", webhook_id=f"u-{n}") for n in range(10)]
    barrier = asyncio.Barrier(len(copies))

    async def one(headers: dict[str, str]) -> int:
        await barrier.wait()
        return (await rx.deliver("shopify", headers, PRODUCT)).status_code

    async with rx:
        statuses = await asyncio.gather(*(one(h) for h in copies))
    assert set(statuses) <= {200, 409}
    assert runs == {
        ("shopify", "e-1", "products/create"): 1,
        ("shopify", "e-2", "products/update"): 1,
    }
