"""The live overview on both stores: its numbers from the ledger (backlog age, handler time
percentiles, failure rate, throughput; extrapolated from a bounded walk when a window is busy),
the page without a script, and the server-sent events that feed the page, over a real uvicorn
and in a real Chromium, updating without a reload."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from receiver import Store
from receiver._console import Console, live

from .conftest import SCREENSHOTS, Served
from .shop import TOKEN, Shop
from .test_sessions import client_of


@pytest.fixture
async def shop(store: Store) -> Shop:
    return Shop(store)


async def test_the_numbers_come_from_the_ledger(shop: Shop, store: Store) -> None:
    for n in range(5):
        assert await shop.send(f"ok_{n}") == 200
    shop.failing.update({"bad_1", "bad_2"})
    for webhook_id in ("bad_1", "bad_2"):
        assert await shop.send(webhook_id) == 500
    assert await shop.send("inv_1", type="invoice.paid", provider="billing") == 200
    console = Console(store, receiver=shop.rx)
    reading = await console.live.reading()
    by_name = {p.name: p for p in reading.providers}
    assert set(by_name) == {"shop", "billing"}
    shop_live, billing = by_name["shop"], by_name["billing"]
    assert shop_live.backlog_age is not None  # two released deliveries wait
    assert 0 <= shop_live.backlog_age < 60
    assert billing.backlog_age is None
    minute = shop_live.windows[0]
    assert minute.seconds == 60
    assert (minute.completed, minute.failed, minute.estimated) == (5, 2, False)
    assert minute.failure_rate == pytest.approx(2 / 7)
    assert minute.per_minute == pytest.approx(5.0)
    assert minute.p50 is not None
    assert minute.p99 is not None
    assert 0 <= minute.p50 <= minute.p99 < 5
    cells = reading.cells()
    assert cells["shop|60|throughput"] == "5.0/min"
    assert cells["shop|60|failures"] == "28.6 %"
    assert cells["billing|900|failures"] == "0.0 %"
    assert cells["billing|backlog"] == "none"
    # The same reading serves every page for a moment: no second walk of the ledger.
    assert await console.live.reading() is reading


async def test_a_busy_window_is_extrapolated_from_a_bounded_walk(
    shop: Shop, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(6):
        await shop.send(f"ok_{n}")
    monkeypatch.setattr(live, "SCAN", 3)
    async with store.acquire() as conn:
        reading = await live.read(conn, shop.rx.clock() + 1, ["shop"])
    fifteen = reading.providers[0].windows[2]
    assert fifteen.estimated
    assert fifteen.completed > 3  # three entries read, over a span shorter than the window
    assert reading.cells()["shop|900|throughput"].startswith("~")


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert live.percentile(values, 50) == 50
    assert live.percentile(values, 95) == 95
    assert live.percentile(values, 99) == 99
    assert live.percentile([7.0], 99) == 7
    assert live.percentile([], 50) is None


async def test_the_page_works_without_a_script(shop: Shop, store: Store) -> None:
    await shop.send("ok_1")
    console = Console(store, receiver=shop.rx)
    async with client_of(console) as client:
        page = await client.get("/live")
        script = await client.get("/live.js")
    assert page.status_code == 200
    assert 'data-live="shop|60|throughput">1.0/min<' in page.text
    assert '<noscript><meta http-equiv="refresh"' in page.text
    assert '<script src="/live.js" defer></script>' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert script.headers["content-type"].startswith("text/javascript")
    assert "EventSource" in script.text


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Shop]]:
    shop = Shop(f"sqlite:///{tmp_path / 'ledger.db'}")
    with Served(Console(shop.rx.store, receiver=shop.rx)) as served:
        yield served, shop


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield orjson.loads(line[6:])


def test_the_events_follow_the_ledger(served: tuple[Served, Shop]) -> None:
    server, shop = served
    server.run(shop.send("ok_1"))
    with httpx.stream("GET", server.url + "/live/events", timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = events(response)
        first = next(stream)
        assert first["cells"]["shop|60|throughput"] == "1.0/min"
        for n in range(2, 5):
            server.run(shop.send(f"ok_{n}"))
        second = next(stream)
    assert second["cells"]["shop|60|throughput"] == "4.0/min"


def test_the_live_page_updates_in_the_browser(served: tuple[Served, Shop], page: Any) -> None:
    from playwright.sync_api import expect

    server, shop = served
    server.run(shop.send("ok_1"))
    shop.failing.add("bad_1")
    server.run(shop.send("bad_1"))
    page.goto(server.url + "/live")
    cell = page.locator('[data-live="shop|60|throughput"]')
    assert cell.inner_text() == "1.0/min"
    page.evaluate("window.sameDocument = true")
    for n in range(2, 8):
        server.run(shop.send(f"ok_{n}"))
    expect(cell).to_have_text("7.0/min", timeout=15_000)
    assert page.evaluate("window.sameDocument") is True  # updated in place, never reloaded
    assert re.match(r"\d\d:\d\d:\d\d UTC", page.locator("#live-at").inner_text())
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "live.png"), full_page=True)


def test_a_stream_ends_with_its_session(tmp_path: Path) -> None:
    shop = Shop(f"sqlite:///{tmp_path / 'ledger.db'}")
    console = Console(shop.rx.store, receiver=shop.rx, token=TOKEN)
    with Served(console) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        login = client.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
        assert csrf is not None
        form = {"csrf": csrf.group(1), "name": "Ada", "token": TOKEN, "next": "/"}
        assert client.post("/login", data=form).status_code == 303
        with client.stream("GET", "/live/events") as response:
            stream = events(response)
            assert "shop|backlog" not in next(stream)["cells"]  # no deliveries yet
            out = client.post("/logout", data={"csrf": csrf.group(1)})
            assert out.status_code == 303
            assert list(stream) == []  # the server ended the stream
        assert client.get("/live/events").status_code == 401
