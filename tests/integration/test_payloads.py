"""Verified bodies at the parser's edges, through the app on both stores: deep nesting is a
recorded 400, a big integer is its exact self (another amount under the same id is 422, never a
replay), and unusual Unicode round-trips to the handler and replays byte for byte."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receiver import Event, Provider, Receiver, Store
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key, State
from tests.support import PROVIDER, SECRET, Clock, signed


@pytest.fixture
async def client(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, list[Any]]]:
    clock = Clock()
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], clock=clock)
    seen: list[Any] = []

    @rx.on("*")
    async def handler(event: Event, tx: object) -> dict[str, Any]:
        seen.append(event.payload)
        return {"seen": len(seen)}

    await rx.open()
    transport = httpx.ASGITransport(app=rx)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        c.headers["x-clock"] = str(clock.now)
        yield c, seen


async def post(client: httpx.AsyncClient, webhook_id: str, body: bytes) -> httpx.Response:
    headers = signed(webhook_id, body, timestamp=float(client.headers["x-clock"]))
    return await client.post(f"/{PROVIDER}", content=body, headers=headers)


async def receipt(store: Store, webhook_id: str) -> ledger.Receipt:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(PROVIDER, webhook_id))
    assert found is not None
    return found


def nested(depth: int) -> bytes:
    """An event whose data nests ``depth`` arrays (the event object itself is one level)."""
    return b'{"type":"deep","data":' + b"[" * depth + b"]" * depth + b"}"


async def test_json_as_deep_as_allowed_is_handled(
    client: tuple[httpx.AsyncClient, list[Any]],
) -> None:
    c, seen = client
    assert (await post(c, "msg_deep", nested(253))).status_code == 200
    assert len(seen) == 1


@pytest.mark.parametrize("depth", [254, 600, 1023, 5000])
async def test_deep_json_is_a_recorded_400(
    store: Store, client: tuple[httpx.AsyncClient, list[Any]], depth: int
) -> None:
    c, seen = client
    body = nested(depth)
    first = await post(c, "msg_deep", body)
    assert first.status_code == 400, first.text
    assert first.json()["error"] == "invalid_payload"
    assert (await receipt(store, "msg_deep")).state is State.FAILED
    again = await post(c, "msg_deep", body)
    assert (again.status_code, again.content) == (400, first.content)
    assert seen == []


async def test_big_integers_are_not_rounded(
    store: Store, client: tuple[httpx.AsyncClient, list[Any]]
) -> None:
    c, seen = client
    one = b'{"type":"payment.created","data":{"amount":18446744073709551616}}'
    two = b'{"type":"payment.created","data":{"amount":18446744073709551617}}'
    first = await post(c, "msg_big", one)
    assert first.status_code == 200
    assert seen == [{"type": "payment.created", "data": {"amount": 2**64}}]
    other = await post(c, "msg_big", two)
    assert other.status_code == 422, other.text
    assert (await post(c, "msg_big", one)).content == first.content


async def test_a_handler_may_answer_with_an_integer_past_64_bits(store: Store) -> None:
    rx = Receiver(store, [Provider(PROVIDER, [SECRET])], sweep_interval=None)

    @rx.on("*")
    async def echo(event: Event, tx: object) -> dict[str, Any]:
        return {"amount": event.payload["data"]["amount"]}

    body = b'{"type":"payment.created","data":{"amount":18446744073709551616}}'
    async with (
        rx,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=rx), base_url="http://test") as c,
    ):
        first = await c.post(f"/{PROVIDER}", content=body, headers=signed("msg_huge", body))
        again = await c.post(f"/{PROVIDER}", content=body, headers=signed("msg_huge", body))
    assert first.status_code == 200, first.text
    assert first.content == again.content == b'{"amount":18446744073709551616}'
    assert again.headers["idempotent-replayed"] == "true"


UNICODE = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=UNICODE)
async def test_unusual_unicode_round_trips(
    store: Store, client: tuple[httpx.AsyncClient, list[Any]], text: str
) -> None:
    c, seen = client
    seen.clear()
    webhook_id = f"msg_{len(text)}_{abs(hash(text))}"
    for ascii_only in (True, False):
        body = json.dumps({"type": "note", "data": {text: text}}, ensure_ascii=ascii_only).encode()
        answer = await post(c, webhook_id, body)
        # The same payload, serialized differently: executed once, then replayed.
        assert answer.status_code == 200, answer.text
    assert seen == [{"type": "note", "data": {text: text}}]


@pytest.mark.parametrize(
    "data",
    [
        [2**64 + i for i in range(44_000)],  # ~1 MiB of integers beyond 64 bits
        "\U0001f600\u2028\ufeff\u0301" * 80_000,  # ~960 KB of unusual Unicode in one string
        {f"k{i}": [i, None, True, 1.5e300] for i in range(25_000)},
    ],
    ids=["big-integers", "unicode", "wide-object"],
)
async def test_huge_json_below_the_size_limit_is_handled(
    client: tuple[httpx.AsyncClient, list[Any]], data: Any
) -> None:
    c, seen = client
    body = json.dumps({"type": "bulk", "data": data}, ensure_ascii=False).encode()
    assert 900_000 < len(body) <= 1024 * 1024
    first = await post(c, "msg_huge", body)
    assert first.status_code == 200, first.text
    assert seen[0]["data"] == data
    again = await post(c, "msg_huge", body)
    assert (again.status_code, again.content) == (200, first.content)
    assert again.headers["idempotent-replayed"] == "true"
