"""The console's behaviour on both stores, through its ASGI app in-process: lists that page
through ties without loss or repeats, what each action does to the ledger and what it refuses,
the audit records, read-only mode, mounting behind a host's authentication, and what is shown
of payloads."""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.routing import Mount

from receiver import (
    ActionFailed,
    ActionNeedsReview,
    Actions,
    Backoff,
    Connection,
    Event,
    Provider,
    Receiver,
    Store,
)
from receiver._cli import main
from receiver._console import Console
from receiver._console import queries as console_queries
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Key
from receiver.testing import Sender
from tests.integration.test_queued import drain

from .shop import SECRET, TOKEN, Shop

T0 = 1_900_000_000.0


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page[:500]
    return found.group(1)


async def audit_rows(store: Store) -> list[dict[str, Any]]:
    async with store.acquire() as conn:
        return [dict(r) for r in await conn.run_all("console_audit_list", None, 100)]


async def state_of(store: Store, provider: str, webhook_id: str) -> tuple[str, int]:
    async with store.acquire() as conn:
        found = await ledger.lookup(conn, Key(provider, webhook_id))
    assert found is not None
    return found.state.value, found.fence


@pytest.fixture
async def shop(store: Store) -> Shop:
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_audit")  # the shared fixture truncates the rest
    return Shop(store)


@pytest.fixture
async def client(shop: Shop) -> AsyncIterator[httpx.AsyncClient]:
    """The console mounted in-process without a token (the host trusts whoever reaches it)."""
    console = shop.rx.console()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console), base_url="http://console.test"
    ) as client:
        yield client


async def post(client: httpx.AsyncClient, path: str, **form: Any) -> httpx.Response:
    """A form as the console's page sends it, with this browser's CSRF token."""
    await client.get("/")
    return await client.post(path, data={"csrf": client.cookies["receiver_console_csrf"], **form})


async def notice_after(client: httpx.AsyncClient, done: httpx.Response) -> str:
    """The notice the page an action redirected to shows (carried in the session)."""
    page = await client.get(done.headers["location"])
    found = re.search(r'<div class="notice">([^<]*)</div>', page.text)
    return "" if found is None else found.group(1)


async def test_pages_walk_ties_across_providers_without_loss_or_repeat(store: Store) -> None:
    """Batched claims share one timestamp: 3 providers x 15 receipts at one instant, and
    more around it, paged 7 at a time (and filtered, with a walk of 5 entries per provider)."""
    expected = []
    async with store.acquire() as conn:
        for n in range(60):
            provider = ("a", "b", "c")[n % 3]
            at = T0 if n < 45 else T0 - n
            webhook_id = f"w{n:03d}"
            await ledger.claim(
                conn,
                Claim(
                    Key(provider, webhook_id),
                    b"h" * 32,
                    "t.even" if n % 2 else "t.odd",
                    b"{}",
                    at,
                    60,
                    3600,
                ),
            )
            expected.append((provider, webhook_id))
        known = await console_queries.providers(conn)
        assert known == ["a", "b", "c"]
        for filters, scan in (
            (console_queries.Filters(), 2000),
            (console_queries.Filters(event_type="t.even"), 5),
        ):
            seen: list[tuple[str, str]] = []
            cursor = None
            for _ in range(100):
                page = await console_queries.list_receipts(
                    conn, known, filters, cursor, None, page=7, scan=scan
                )
                seen += [(r.provider, r.webhook_id) for r in page.rows]
                if page.next is None:
                    break
                cursor = console_queries.Cursor.decode(page.next.encode(), store.dialect)
            want = [e for e in expected if not filters.event_type or int(e[1][1:]) % 2]
            assert sorted(seen) == sorted(want)
            assert len(seen) == len(set(seen))


async def test_an_operators_replay_runs_and_a_senders_redelivery_does_not(
    shop: Shop, client: httpx.AsyncClient
) -> None:
    shop.failing.add("msg_1")
    assert await shop.send("msg_1") == 500
    shop.failing.clear()
    answered = await post(
        client,
        "/replay",
        provider="shop",
        id="msg_1",
        fence="1",
        reason="fixed",
        operator="Grace",
    )
    assert answered.status_code == 303
    assert await state_of(shop.rx.store, "shop", "msg_1") == ("completed", 2)
    assert shop.runs["msg_1"] == 2
    assert await shop.send("msg_1") == 200  # the stored answer
    assert shop.runs["msg_1"] == 2
    (row,) = await audit_rows(shop.rx.store)
    assert (row["actor"], row["action"], row["reason"], row["outcome"]) == (
        "Grace (as typed)",
        "replay",
        "fixed",
        "executed",
    )
    # A completed delivery is not replayed: that is a re-run, behind its confirmation.
    refused = await post(
        client,
        "/replay",
        provider="shop",
        id="msg_1",
        fence="2",
        reason="again",
        operator="Grace",
    )
    assert refused.status_code == 409
    assert "completed" in refused.text
    assert shop.runs["msg_1"] == 2


async def test_the_rerun_page_is_for_completed_deliveries_only(
    shop: Shop, client: httpx.AsyncClient
) -> None:
    shop.failing.add("msg_4")
    assert await shop.send("msg_4") == 500
    refused = await client.get("/rerun", params={"provider": "shop", "id": "msg_4"})
    assert refused.status_code == 409
    assert "not completed: replay it instead" in refused.text
    shop.failing.discard("msg_4")
    assert await shop.send("msg_5") == 200
    form = await client.get("/rerun", params={"provider": "shop", "id": "msg_5"})
    assert form.status_code == 200
    assert 'name="confirm"' in form.text


async def test_a_rerun_needs_the_deliverys_own_payload_and_a_confirmation(
    shop: Shop, client: httpx.AsyncClient
) -> None:
    await shop.send("msg_9", amount=5)
    body = shop.sent["msg_9"].body
    form = {
        "provider": "shop",
        "id": "msg_9",
        "fence": "1",
        "reason": "bug 12 fixed",
        "operator": "Grace",
        "confirm": "msg_9",
    }
    other = orjson.dumps({**orjson.loads(body), "data": {"id": "msg_9", "amount": 6}})
    for bad, why in (
        ({**form, "payload": other.decode()}, "normalized hash differs"),
        ({**form, "payload": body.decode(), "confirm": "msg_8"}, "not confirmed"),
        ({**form, "payload": body.decode(), "reason": "  "}, "say why"),
        ({**form, "payload": body.decode(), "fence": "7"}, "changed since you looked"),
    ):
        refused = await post(client, "/rerun", **bad)
        assert refused.status_code == 409
        assert why in refused.text
    assert await state_of(shop.rx.store, "shop", "msg_9") == ("completed", 1)
    assert await audit_rows(shop.rx.store) == []  # refused input writes nothing
    # Re-serialized (a pasted copy is rarely byte-identical): the normalized hash matches.
    pasted = orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode()
    done = await post(client, "/rerun", **{**form, "payload": pasted})
    assert done.status_code == 303
    assert "executed" in await notice_after(client, done)
    assert shop.runs["msg_9"] == 2
    assert await state_of(shop.rx.store, "shop", "msg_9") == ("completed", 2)
    metrics = shop.rx.metrics
    assert metrics is not None
    assert not any(
        s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "receiver_double_executions_total"
    )
    (row,) = await audit_rows(shop.rx.store)
    assert (row["action"], row["actor"], row["reason"], row["fence"]) == (
        "rerun",
        "Grace (as typed)",
        "bug 12 fixed",
        1,
    )
    assert await shop.send("msg_9") == 200
    assert shop.runs["msg_9"] == 2


async def test_settling_what_needs_review_for_webhooks_and_agent_actions(
    shop: Shop, client: httpx.AsyncClient
) -> None:
    store = shop.rx.store
    actions = Actions(store)

    @actions.tool("refund", effects="external")  # no reconcile: a crash needs a person
    async def refund(call: Any, tx: Any) -> dict[str, str]:
        raise AssertionError("never called again after its attempt died")

    keys = []
    for order in ("o1", "o2"):
        action = actions.propose("refund", scope="t1", action_id=order, request={"n": order})
        async with store.acquire() as conn:  # an attempt that died mid-call, lease over
            await ledger.claim(
                conn,
                Claim(
                    Key("action:refund", action.key), action.fingerprint, None, b"{}", None, 0, 3600
                ),
            )
        with pytest.raises(ActionNeedsReview):
            await actions.execute(action)
        keys.append(action)
    fence = str((await state_of(store, "action:refund", keys[0].key))[1])
    await shop.needs_review("pay_1")

    resolved = await post(
        client,
        "/resolve",
        provider="action:refund",
        id=keys[0].key,
        fence=fence,
        reason="refund found at the bank",
        answer='{"refund": "re_1"}',
        operator="Grace",
    )
    assert resolved.status_code == 303
    result = await actions.execute(keys[0])
    assert result.value == {"refund": "re_1"}
    assert result.replayed
    failed = await post(
        client,
        "/fail",
        provider="action:refund",
        id=keys[1].key,
        fence=fence,
        reason="never happened; the customer was told",
        operator="Grace",
    )
    assert failed.status_code == 303
    with pytest.raises(ActionFailed) as raised:
        await actions.execute(keys[1])
    assert not isinstance(raised.value, ActionNeedsReview)
    # Not JSON: refused, nothing stored.
    bad = await post(
        client,
        "/resolve",
        provider="shop",
        id="pay_1",
        fence="1",
        reason="x",
        answer="{nope",
        operator="Grace",
    )
    assert bad.status_code == 409
    assert "must be JSON" in bad.text
    assert (await state_of(store, "shop", "pay_1"))[0] == "failed"
    done = await post(
        client, "/fail", provider="shop", id="pay_1", fence="1", reason="dup", operator="Grace"
    )
    assert done.status_code == 303
    page = await client.get("/attention?list=needs_review")
    assert "pay_1" not in page.text
    assert keys[0].key not in page.text
    assert "pay_1" in (await client.get("/attention?list=failed")).text
    actions_done = [r["action"] for r in await audit_rows(store)]
    assert actions_done == ["fail", "fail", "resolve"]


async def test_nothing_changes_on_get_and_read_only_changes_nothing(shop: Shop) -> None:
    shop.failing.add("msg_1")
    await shop.send("msg_1")
    console = Console(shop.rx.store, receiver=shop.rx, read_only=True)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console), base_url="http://console.test"
    ) as client:
        page = await client.get("/receipt?provider=shop&id=msg_1")
        assert page.status_code == 200
        assert "read-only" in page.text
        assert 'action="/replay"' not in page.text
        assert (await client.get("/replay?provider=shop&id=msg_1&fence=1")).status_code == 405
        refused = await client.post(
            "/replay",
            data={
                "csrf": client.cookies["receiver_console_csrf"],
                "provider": "shop",
                "id": "msg_1",
                "fence": "1",
                "reason": "x",
                "operator": "x",
            },
        )
        assert refused.status_code == 403
        assert "read-only" in refused.text
    assert await state_of(shop.rx.store, "shop", "msg_1") == ("released", 1)
    assert await audit_rows(shop.rx.store) == []


class HostAuth(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        return AuthCredentials(["authenticated"]), SimpleUser("grace@example.com")


async def test_mounted_it_trusts_the_hosts_user(shop: Shop) -> None:
    shop.failing.add("msg_1")
    await shop.send("msg_1")
    shop.failing.clear()
    host = Starlette(
        routes=[Mount("/ops/console", shop.rx.console())],
        middleware=[Middleware(AuthenticationMiddleware, backend=HostAuth())],
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=host), base_url="http://host.test"
    ) as client:
        page = await client.get("/ops/console/receipt?provider=shop&id=msg_1")
        assert "grace@example.com (from the host app)" in page.text
        assert 'href="/ops/console/console.css"' in page.text
        assert 'name="operator"' not in page.text  # the host says who acts
        done = await client.post(
            "/ops/console/replay",
            data={
                "csrf": csrf_of(page.text),
                "provider": "shop",
                "id": "msg_1",
                "fence": "1",
                "reason": "fixed",
            },
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/ops/console/receipt?")
    (row,) = await audit_rows(shop.rx.store)
    assert row["actor"] == "grace@example.com"


async def test_payloads_are_hidden_unless_enabled_and_then_redacted(shop: Shop) -> None:
    shop.failing.add("msg_1")
    await shop.send(
        "msg_1",
        email="ann@example.com",
        card_number="4111 1111 1111 1111",
        password="hunter2",
        note="call Bearer abc.def",
        amount=31415926535,  # longer than any digit run in the page's timestamps
    )
    for show, visible in ((False, False), (True, True)):
        console = Console(shop.rx.store, receiver=shop.rx, show_payloads=show)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console), base_url="http://console.test"
        ) as client:
            page = (await client.get("/receipt?provider=shop&id=msg_1")).text
        assert ("31415926535" in page) is visible
        assert ("ann@example.com" in page) is visible
        for secret in ("hunter2", "4111", "abc.def"):
            assert secret not in page
        assert ("•••" in page) is visible


async def test_a_token_is_required_when_served_alone(shop: Shop) -> None:
    await shop.send("msg_1")
    console = Console(shop.rx.store, receiver=shop.rx, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console), base_url="http://console.test"
    ) as client:
        refused = await client.get("/receipts")
        assert refused.status_code == 401
        assert "msg_1" not in refused.text
        login = await client.get("/login")
        form = {"csrf": csrf_of(login.text), "name": "Ada", "next": "/receipts"}
        wrong = await client.post("/login", data={**form, "token": TOKEN + "x"})
        assert wrong.status_code == 401
        forged = await client.post("/login", data={**form, "csrf": "x" * 43, "token": TOKEN})
        assert forged.status_code == 403
        client.cookies.set("receiver_console_session", "e30.deadbeef")  # a forged session
        assert (await client.get("/receipts")).status_code == 401
        client.cookies.delete("receiver_console_session")
        signed = await client.post("/login", data={**form, "token": TOKEN})
        assert signed.status_code == 303
        assert signed.headers["location"] == "/receipts"
        assert "msg_1" in (await client.get("/receipts")).text


async def test_a_rerun_of_a_completed_queued_delivery_queues_it_again(store: Store) -> None:
    """A queued delivery's re-run goes back to the workers (due now, next fence) and keeps the
    sender's stored 202: the sender's redelivery still replays it and runs nothing."""
    rx = Receiver(
        store=store,
        providers=[Provider("jobs", secrets=[SECRET], mode="queued")],
        sweep_interval=None,
    )
    runs: collections.Counter[str] = collections.Counter()

    @rx.on("order.*")
    async def order(event: Event, tx: Connection) -> dict[str, int]:
        runs[event.id] += 1
        return {"run": runs[event.id]}

    async with rx, Sender(rx, "jobs", SECRET) as sender:
        webhook = sender.event("order.created", {"id": "q1"}, id="q1")
        assert (await sender.send(webhook)).status == 202
        await drain(rx)
        assert runs["q1"] == 1
        assert await state_of(store, "jobs", "q1") == ("completed", 1)
        console = rx.console()
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console), base_url="http://console.test"
        ) as client:
            done = await post(
                client,
                "/rerun",
                provider="jobs",
                id="q1",
                fence="1",
                reason="handler bug fixed",
                operator="Ada",
                confirm="q1",
                payload=webhook.body.decode(),
            )
            assert done.status_code == 303, done.text
            assert "queued" in await notice_after(client, done)
        assert (await state_of(store, "jobs", "q1"))[0] == "queued"
        await drain(rx)
        assert runs["q1"] == 2
        assert await state_of(store, "jobs", "q1") == ("completed", 2)
        redelivered = await sender.send(webhook)
        assert redelivered.status == 202
        assert runs["q1"] == 2
    (row,) = await audit_rows(store)
    assert (row["action"], row["outcome"], row["fence"]) == ("rerun", "queued", 1)


async def test_the_attempts_count_agrees_with_the_attempts_listed(
    store: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queued delivery failed, replayed by an operator (a fresh round of retries) and failed
    again: the receipt's page and ``receiver inspect`` count the two attempts they list, and
    say how many of them belong to the round since the replay."""
    rx = Receiver(
        store=store,
        providers=[Provider("jobs", secrets=[SECRET], mode="queued", retry=Backoff(attempts=1))],
        sweep_interval=None,
    )

    @rx.on("order.*")
    async def order(event: Event, tx: Connection) -> None:
        raise RuntimeError("downstream is down")

    async with rx, Sender(rx, "jobs", SECRET) as sender:
        webhook = sender.event("order.created", {"id": "q1"}, id="q1")
        assert (await sender.send(webhook)).status == 202
        await drain(rx)
        console = rx.console()
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console), base_url="http://console.test"
        ) as client:
            _, fence = await state_of(store, "jobs", "q1")
            done = await post(
                client,
                "/replay",
                provider="jobs",
                id="q1",
                fence=str(fence),
                reason="retry",
                operator="Ada",
            )
            assert done.status_code == 303, done.text
            await drain(rx)
            assert (await state_of(store, "jobs", "q1"))[0] == "failed"
            page = (await client.get("/receipt", params={"provider": "jobs", "id": "q1"})).text
    assert page.count("RuntimeError: downstream is down") == 2
    assert "2 (1 since its last replay or re-queue)" in page
    # The command reads the ledger in a loop of its own.
    await asyncio.to_thread(main, ["inspect", "--store", store_url, "jobs", "q1"])
    shown = capsys.readouterr().out
    assert "attempts     2 (1 since its last replay or re-queue) failed" in shown
    assert shown.count("RuntimeError: downstream is down") == 2
