"""Telling a sender to stop, on SQLite and PostgreSQL: a delivery that failed for good (a
payload mismatch, an invalid payload, a handler's final 4xx answer, and every replay of them) is
answered with the sender's documented "do not retry" signal: Svix's ``webhook-delivery:
abort-message`` for Standard Webhooks, Slack's ``X-Slack-No-Retry: 1``. A sender that documents
none (Stripe, Paddle, ...) gets its answer unchanged; an answer that asks for a retry (5xx, 409,
429) or succeeded never carries the signal."""

from __future__ import annotations

import orjson
import pytest
from starlette.responses import JSONResponse, Response

from receiver import (
    Connection,
    Event,
    Provider,
    Receiver,
    Slack,
    Store,
    Stripe,
    sign,
    sign_slack,
    sign_stripe,
)
from tests.support import SECRET, T0, Clock

SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
STRIPE_SECRET = "whsec_stripeEndpointSecret"
ABORT = ("webhook-delivery", "abort-message")


def standard(webhook_id: str, body: bytes, now: float) -> dict[str, str]:
    ts = int(now)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(SECRET, webhook_id, ts, body),
        "content-type": "application/json",
    }


def body(event_type: str, **data: object) -> bytes:
    return orjson.dumps({"type": event_type, "data": data})


def build(store: Store, clock: Clock) -> Receiver:
    rx = Receiver(
        store,
        [
            Provider("acme", [SECRET]),
            Provider("slack", verifier=Slack([SLACK_SECRET]), schedule="slack"),
            Provider("stripe", verifier=Stripe([STRIPE_SECRET]), schedule="stripe"),
        ],
        clock=clock,
        sweep_interval=None,
    )

    @rx.on("order.refused")
    async def refuse(event: Event, tx: Connection) -> Response:
        # A permanent failure, declared by the handler: a final 4xx, stored and replayed.
        return JSONResponse({"error": "unknown customer"}, status_code=422)

    @rx.on("order.later")
    async def later(event: Event, tx: Connection) -> Response:
        return JSONResponse({"error": "busy"}, status_code=429, headers={"retry-after": "30"})

    @rx.on("order.broken")
    async def broken(event: Event, tx: Connection) -> None:
        raise RuntimeError("a downstream timeout")

    @rx.on("order.created")
    async def created(event: Event, tx: Connection) -> dict[str, str]:
        return {"order": event.id}

    @rx.on("app_mention", provider="slack")
    async def mention(event: Event, tx: Connection) -> Response:
        return JSONResponse({"error": "no such channel"}, status_code=404)

    @rx.on("invoice.paid", provider="stripe")
    async def paid(event: Event, tx: Connection) -> Response:
        return JSONResponse({"error": "no such invoice"}, status_code=404)

    return rx


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


async def test_standard_webhooks_permanent_failures_tell_svix_to_abort(
    store: Store, clock: Clock
) -> None:
    rx = build(store, clock)
    refused, created = body("order.refused"), body("order.created")
    other = body("order.created", changed=True)
    async with rx:
        first = await rx.deliver("acme", standard("msg_r", refused, clock()), refused)
        clock.advance(5)
        again = await rx.deliver("acme", standard("msg_r", refused, clock()), refused)
        ok = await rx.deliver("acme", standard("msg_c", created, clock()), created)
        mismatch = await rx.deliver("acme", standard("msg_c", other, clock()), other)
        invalid = await rx.deliver("acme", standard("msg_i", b"[]", clock()), b"[]")
        invalid_again = await rx.deliver("acme", standard("msg_i", b"[]", clock()), b"[]")
    assert first.status_code == 422
    assert again.headers.get("idempotent-replayed") == "true"
    assert mismatch.status_code == 422
    assert orjson.loads(mismatch.body)["error"] == "payload_mismatch"
    assert (invalid.status_code, invalid_again.status_code) == (400, 400)
    for answer in (first, again, mismatch, invalid, invalid_again):
        assert answer.headers.get(ABORT[0]) == ABORT[1], answer.headers
    assert ok.status_code == 200
    assert ABORT[0] not in ok.headers


async def test_answers_that_ask_for_a_retry_never_carry_the_signal(
    store: Store, clock: Clock
) -> None:
    rx = build(store, clock)
    later, broken = body("order.later"), body("order.broken")
    async with rx:
        busy = await rx.deliver("acme", standard("msg_l", later, clock()), later)
        failed = await rx.deliver("acme", standard("msg_b", broken, clock()), broken)
    assert busy.status_code == 429
    assert failed.status_code == 500
    assert ABORT[0] not in busy.headers
    assert ABORT[0] not in failed.headers


async def test_slack_is_told_not_to_retry_and_stripe_documents_no_such_answer(
    store: Store, clock: Clock
) -> None:
    rx = build(store, clock)
    ts = int(clock())
    mention = orjson.dumps(
        {"type": "event_callback", "event_id": "Ev1", "event": {"type": "app_mention"}}
    )
    slack_headers = {
        "x-slack-signature": sign_slack(SLACK_SECRET, ts, mention),
        "x-slack-request-timestamp": str(ts),
        "content-type": "application/json",
    }
    invoice = orjson.dumps({"id": "evt_1", "object": "event", "type": "invoice.paid"})
    stripe_headers = {
        "stripe-signature": sign_stripe(STRIPE_SECRET, ts, invoice),
        "content-type": "application/json",
    }
    async with rx:
        slack = await rx.deliver("slack", slack_headers, mention)
        slack_again = await rx.deliver("slack", slack_headers, mention)
        stripe = await rx.deliver("stripe", stripe_headers, invoice)
    assert (slack.status_code, slack_again.status_code) == (404, 404)
    assert slack.headers.get("x-slack-no-retry") == "1"
    assert slack_again.headers.get("x-slack-no-retry") == "1"
    assert stripe.status_code == 404
    assert ABORT[0] not in stripe.headers
    assert "x-slack-no-retry" not in stripe.headers
