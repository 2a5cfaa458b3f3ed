"""The console in a real browser (Playwright driving Debian's Chromium, headless) against a
console served alone by uvicorn, behind its token, on a real SQLite ledger: what an operator
sees and does, end to end. The screenshots in docs/console/ are made here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver._console import Console
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Key, Receipt

from .conftest import SCREENSHOTS, Served
from .shop import TOKEN, Shop


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    return Shop(f"sqlite:///{tmp_path / 'ledger.db'}")


@pytest.fixture
def served(shop: Shop) -> Iterator[Served]:
    with Served(Console(shop.rx.store, receiver=shop.rx, token=TOKEN)) as served:
        yield served


def receipt(served: Served, shop: Shop, webhook_id: str, provider: str = "shop") -> Receipt:
    async def look() -> Receipt | None:
        async with shop.rx.store.acquire() as conn:
            return await ledger.lookup(conn, Key(provider, webhook_id))

    found = served.run(look())
    assert found is not None
    return found


def sign_in(page: Any, served: Served, path: str = "/") -> None:
    page.goto(served.url + path)
    page.fill("input[name=name]", "Ada Operator")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("header .who")


def test_refused_without_the_token(page: Any, served: Served, shop: Shop) -> None:
    served.run(shop.send("msg_1"))
    response = page.goto(served.url + "/receipts")
    assert response.status == 401
    assert page.locator("input[name=token]").is_visible()
    assert "msg_1" not in page.content()
    page.fill("input[name=name]", "Mallory")
    page.fill("input[name=token]", "not-the-token-at-all-0000")
    with page.expect_response(lambda r: r.url.endswith("/login")) as answered:
        page.click("button:has-text('Sign in')")
    assert answered.value.status == 401
    assert "wrong token" in page.content()
    # A POST without a session is refused too, and changes nothing.
    shop.failing.add("msg_2")
    served.run(shop.send("msg_2"))
    refused = page.request.post(
        served.url + "/replay",
        form={"provider": "shop", "id": "msg_2", "fence": "1", "reason": "x"},
    )
    assert refused.status == 401
    assert receipt(served, shop, "msg_2").state.value == "released"
    # With the token: the page asked for in the first place.
    page.fill("input[name=name]", "Ada Operator")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("text=signed in as Ada Operator")
    assert page.url.endswith("/receipts")
    assert page.locator("a:has-text('msg_1')").is_visible()


def test_overview_filter_open_a_failed_receipt_and_replay_it(
    page: Any, served: Served, shop: Shop
) -> None:
    shop.failing.add("msg_broken")
    for n in range(1, 6):
        served.run(shop.send(f"msg_{n}", amount=100 * n))
    served.run(shop.send("inv_1", type="invoice.paid", provider="billing"))
    assert served.run(shop.send("msg_broken", email="ann@example.com")) == 500
    served.run(shop.needs_review("pay_1"))
    sign_in(page, served)

    cards = page.locator(".cards").inner_text()
    assert "Needs review\n1" in cards
    assert "Released (retry due)\n1" in cards
    providers = page.locator("table.providers").inner_text()
    assert "shop" in providers
    assert "billing" in providers
    assert "2 d 4 h configured" in providers
    assert page.locator(".chart svg rect.bar-deliveries").count() == 24
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)

    page.click("header nav >> text=Receipts")
    page.select_option("select[name=provider]", "shop")
    page.select_option("select[name=state]", "released")
    page.click("button:has-text('Filter')")
    rows = page.locator("tbody tr")
    assert rows.count() == 1
    assert "msg_broken" in rows.inner_text()
    assert "inventory service timed out" in rows.inner_text()

    page.click("a:has-text('msg_broken')")
    assert "RuntimeError: inventory service timed out" in page.content()
    assert "ann@example.com" not in page.content()  # payloads are hidden unless enabled
    page.screenshot(path=str(SCREENSHOTS / "receipt.png"), full_page=True)

    shop.failing.discard("msg_broken")  # the bug is fixed
    page.fill("form[action$='/replay'] input[name=reason]", "inventory service is back")
    page.click("button:has-text('Replay')")
    page.wait_for_selector(".notice")
    assert "Replayed: executed (HTTP 200, fence 2)" in page.locator(".notice").inner_text()
    assert page.locator("dd .badge.completed").is_visible()
    assert shop.runs["msg_broken"] == 2

    # A sender's redelivery stays deduplicated: the stored answer, no third run.
    assert served.run(shop.send("msg_broken")) == 200
    assert shop.runs["msg_broken"] == 2

    page.click("header nav >> text=Audit")
    audit = page.locator("tbody tr").first.inner_text()
    assert "Ada Operator" in audit
    assert "replay" in audit
    assert "inventory service is back" in audit
    assert "executed" in audit


def test_rerun_a_completed_delivery_through_the_confirmation(
    page: Any, served: Served, shop: Shop
) -> None:
    served.run(shop.send("msg_done", amount=1200))
    assert shop.runs["msg_done"] == 1
    sign_in(page, served, "/receipt?provider=shop&id=msg_done")
    page.click("a.rerun")
    assert "You are about to run the handlers" in page.content()
    payload = shop.sent["msg_done"].body.decode()

    # A wrong confirmation is refused and changes nothing.
    page.fill("textarea[name=payload]", payload)
    page.fill("form.confirm input[name=reason]", "the handler dropped the amount; fixed in 1.4.2")
    page.fill("input[name=confirm]", "msg_other")
    page.click("button:has-text('Run the handlers again')")
    assert "not confirmed" in page.content()
    assert receipt(served, shop, "msg_done").fence == 1
    assert shop.runs["msg_done"] == 1

    page.go_back()
    page.fill("textarea[name=payload]", payload)
    page.fill("form.confirm input[name=reason]", "the handler dropped the amount; fixed in 1.4.2")
    page.fill("input[name=confirm]", "msg_done")
    page.click("button:has-text('Run the handlers again')")
    page.wait_for_selector(".notice")
    assert "Re-run: executed (HTTP 200, fence 2)" in page.locator(".notice").inner_text()
    assert shop.runs["msg_done"] == 2
    done = receipt(served, shop, "msg_done")
    assert done.state.value == "completed"
    assert done.fence == 2
    assert done.response is not None
    assert b'"run":2' in done.response.body
    # Recorded as the operator's action, never counted as a double execution.
    assert "rerun" in page.locator("table").last.inner_text()
    metrics = shop.rx.metrics
    assert metrics is not None
    assert metrics.registry.get_sample_value(
        "receiver_double_executions_total", {"provider": "shop", "evidence": "fenced"}
    ) in (0.0, None)
    # Senders stay deduplicated: a redelivery gets the new stored answer.
    assert served.run(shop.send("msg_done")) == 200
    assert shop.runs["msg_done"] == 2


def test_resolve_a_needs_review_item(page: Any, served: Served, shop: Shop) -> None:
    served.run(shop.needs_review("pay_1"))
    sign_in(page, served, "/attention?list=needs_review")
    page.click("a:has-text('pay_1')")
    assert page.locator("dd .badge.needs_review").is_visible()
    page.fill(
        "form[action$='/resolve'] input[name=reason]",
        "refund went through at the bank (ref 8891); reconciled by hand",
    )
    page.click("button:has-text('Mark resolved')")
    page.wait_for_selector(".notice")
    assert "Resolved: stored as completed" in page.locator(".notice").inner_text()
    settled = receipt(served, shop, "pay_1")
    assert settled.state.value == "completed"
    assert settled.response is not None
    assert settled.response.body == b'{"status":"resolved"}'
    page.goto(served.url + "/attention?list=needs_review")
    assert "pay_1" not in page.locator("table").inner_text()


def test_a_post_without_the_csrf_token_is_refused(page: Any, served: Served, shop: Shop) -> None:
    shop.failing.add("msg_bad")
    served.run(shop.send("msg_bad"))
    shop.failing.clear()
    sign_in(page, served, "/receipt?provider=shop&id=msg_bad")
    page.fill("form[action$='/replay'] input[name=reason]", "try it")
    # The form as a forged page would send it: everything but the CSRF token.
    page.evaluate("document.querySelector(\"form[action$='/replay'] input[name=csrf]\").remove()")
    with page.expect_response(lambda r: r.url.endswith("/replay")) as answered:
        page.click("button:has-text('Replay')")
    assert answered.value.status == 403
    assert "the form carried no CSRF token" in page.content()
    forged = page.request.post(
        served.url + "/replay",
        form={"provider": "shop", "id": "msg_bad", "fence": "1", "reason": "x", "csrf": "f" * 43},
    )
    assert forged.status == 403
    assert receipt(served, shop, "msg_bad").state.value == "released"
    assert shop.runs["msg_bad"] == 1
