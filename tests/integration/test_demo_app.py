"""The demo app that ``scripts/serve`` runs (``handlers/``), on both stores: whatever a signed
event carries in its ``data``, the answer is 200 with the order written once, or a final 422
that writes nothing; never a 5xx (a database error from a value the table cannot hold)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import handlers
from receiver import PostgresStore, Provider, Receiver, SQLiteStore, Store
from tests.conftest import truncate
from tests.support import SECRET, signed

#: JSON values of every kind, with the edges a table cannot hold: NUL, huge and negative
#: integers, floats, booleans, long strings.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=5,
)
EDGES = st.sampled_from(
    ["", "a\x00b", "x" * 201, "x" * 200, 0, -1, 2**31 - 1, 2**31, 2**63, 1.5, 1e308, True, "12"]
)


class Demo:
    """The demo Receiver on one store, driven from synchronous hypothesis tests."""

    def __init__(self, runner: asyncio.Runner, store: Store) -> None:
        self.runner = runner
        self.store = store
        self.rx = Receiver(store, [Provider("demo", [SECRET], schedule="svix")])
        handlers.register(self.rx)
        self.runner.run(self.rx.open())
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.rx), base_url="http://demo"
        )
        self._ids: Iterator[int] = itertools.count()

    def send(self, event_type: str, data: Any) -> httpx.Response:
        # json, not orjson: integers past 64 bits are part of what is sent.
        body = json.dumps({"type": event_type, "data": data}).encode()
        headers = signed(f"msg_demo_{next(self._ids)}", body)
        return self.runner.run(self.client.post("/demo", content=body, headers=headers))

    def orders(self) -> list[tuple[str, str, int]]:
        async def go() -> list[tuple[str, str, int]]:
            async with self.store.acquire() as conn:
                rows = await conn.fetch("SELECT id, customer, amount_cents FROM orders")
            return [(r["id"], r["customer"], r["amount_cents"]) for r in rows]

        return self.runner.run(go())

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.run(self.rx.close())


@pytest.fixture(params=["sqlite", "postgresql"])
def demo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Demo]:
    with asyncio.Runner() as runner:
        store: Store
        if request.param == "sqlite":
            store = SQLiteStore(tmp_path / "demo.db")
        else:
            url: str = request.getfixturevalue("pg_url")
            runner.run(truncate(url))
            runner.run(_drop_orders(url))
            store = PostgresStore(url, max_size=4)
        app = Demo(runner, store)
        try:
            yield app
        finally:
            app.close()
            if request.param == "postgresql":
                runner.run(_drop_orders(url))


async def _drop_orders(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP TABLE IF EXISTS orders")
    finally:
        await conn.close()


def valid(data: Any) -> bool:
    """What the demo's order.created takes: an order id and an optional customer, strings of
    1-200 characters without NUL, and whole cents that fit the table's INTEGER."""

    def text(value: Any) -> bool:
        return isinstance(value, str) and 1 <= len(value) <= 200 and "\x00" not in value

    if not isinstance(data, dict) or not text(data.get("order_id")):
        return False
    if "customer" in data and not text(data["customer"]):
        return False
    cents = data.get("amount_cents", 0)
    return type(cents) is int and 0 <= cents <= 2**31 - 1


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    order_id=st.one_of(JSON, EDGES),
    customer=st.one_of(JSON, EDGES, st.just(None)),
    cents=st.one_of(JSON, EDGES, st.just(None)),
)
@example(order_id="o-1", customer="c", cents=2**31)  # past INTEGER on PostgreSQL
@example(order_id="o-1", customer="c", cents=10**30)  # past INTEGER on SQLite
@example(order_id="o-1", customer="c", cents=1e308)
@example(order_id="a\x00b", customer="c", cents=1)  # PostgreSQL's text cannot hold NUL
@example(order_id="o-1", customer={"a": 1}, cents=1)
@example(order_id="o-1", customer="c", cents="12")
def test_order_created_is_200_once_or_a_final_422_never_a_5xx(
    demo: Demo, order_id: Any, customer: Any, cents: Any
) -> None:
    data: dict[str, Any] = {"order_id": order_id}
    if customer is not None:
        data["customer"] = customer
    if cents is not None:
        data["amount_cents"] = cents
    before = demo.orders()
    answer = demo.send("order.created", data)
    after = demo.orders()
    if not valid(data):
        assert answer.status_code == 422, (data, answer.text)
        assert after == before  # nothing written
        assert set(answer.json()) == {"error"}
        return
    assert answer.status_code == 200, (data, answer.text)
    known = [row for row in before if row[0] == order_id]
    if known:  # an order it already has, under another webhook-id: not written again
        assert after == before
        assert answer.json()["note"] == "already known"
    else:
        assert sorted(after) == sorted(
            [*before, (order_id, data.get("customer", "unknown"), data.get("amount_cents", 0))]
        )


@pytest.mark.parametrize("event_type", ["order.paid", "order.cancelled"])
@pytest.mark.parametrize("data", [None, [1], {}, {"order_id": 5}, {"order_id": "a\x00b"}])
def test_status_changes_refuse_what_names_no_order(demo: Demo, event_type: str, data: Any) -> None:
    answer = demo.send(event_type, data)
    assert answer.status_code == 422, answer.text
    assert demo.orders() == []


def test_an_order_is_created_then_paid(demo: Demo) -> None:
    assert demo.send("order.created", {"order_id": "o-1", "amount_cents": 1250}).status_code == 200
    paid = demo.send("order.paid", {"order_id": "o-1"})
    assert (paid.status_code, paid.json()) == (200, {"order_id": "o-1", "status": "paid"})
    assert demo.orders() == [("o-1", "unknown", 1250)]
    unknown = demo.send("order.paid", {"order_id": "o-2"})
    assert unknown.status_code == 422
