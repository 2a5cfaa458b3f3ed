"""Console sessions kept in the ledger, on both stores: a copy of the cookie is dead after
sign-out, expiry or ending all sessions; notices travel in the session, never in the URL;
operators with tokens of their own and a role, and the audit says who acted."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from receiver import Store
from receiver._console import Console
from receiver._exceptions import ConfigurationError

from .shop import TOKEN, Shop
from .test_console import audit_rows, csrf_of, notice_after, state_of

RECEIVER = str(Path(sys.executable).parent / "receiver")
ADA = "ada-operator-token-0123456789"
BOB = "bob-read-only-token-987654321"
OPERATORS = [
    {"name": "Ada", "role": "operator", "token": ADA},
    {"name": "Bob", "role": "read-only", "token_sha256": hashlib.sha256(BOB.encode()).hexdigest()},
]


@pytest.fixture
async def shop(store: Store) -> Shop:
    async with store.acquire() as conn:
        await conn.execute("DELETE FROM receiver_audit")
        await conn.execute("DELETE FROM receiver_console_sessions")
    return Shop(store)


def client_of(console: Console) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console), base_url="http://console.test"
    )


async def sign_in(client: httpx.AsyncClient, token: str, name: str = "") -> httpx.Response:
    login = await client.get("/login")
    form = {"csrf": csrf_of(login.text), "next": "/receipts", "token": token}
    return await client.post("/login", data={**form, "name": name} if name else form)


async def replay_form(client: httpx.AsyncClient, webhook_id: str) -> dict[str, str]:
    page = await client.get(f"/receipt?provider=shop&id={webhook_id}")
    assert page.status_code == 200, page.text[:300]
    return {
        "csrf": csrf_of(page.text),
        "provider": "shop",
        "id": webhook_id,
        "fence": "1",
        "reason": "inventory is back",
    }


@pytest.fixture
async def console(shop: Shop) -> Console:
    return Console(shop.rx.store, receiver=shop.rx, token=TOKEN)


async def test_a_copy_of_the_cookie_is_dead_after_sign_out(shop: Shop, console: Console) -> None:
    shop.failing.add("msg_1")
    await shop.send("msg_1")
    shop.failing.clear()
    async with client_of(console) as ada, client_of(console) as thief:
        assert (await sign_in(ada, TOKEN, "Ada")).status_code == 303
        copied = ada.cookies["receiver_console_session"]
        csrf = ada.cookies["receiver_console_csrf"]
        for name, value in (
            ("receiver_console_session", copied),
            ("receiver_console_csrf", csrf),
        ):
            thief.cookies.set(name, value)
        assert "msg_1" in (await thief.get("/receipts")).text  # the copy works while signed in
        form = await replay_form(ada, "msg_1")
        out = await ada.post("/logout", data={"csrf": form["csrf"]})
        assert out.status_code == 303
        assert (await ada.get("/receipts")).status_code == 401
        refused = await thief.get("/receipts")
        assert refused.status_code == 401
        assert "msg_1" not in refused.text
        replayed = await thief.post("/replay", data=form)
        assert replayed.status_code == 401
    assert await state_of(shop.rx.store, "shop", "msg_1") == ("released", 1)
    assert shop.runs["msg_1"] == 1
    assert await audit_rows(shop.rx.store) == []


async def test_head_is_answered_as_get_and_changes_nothing(shop: Shop, console: Console) -> None:
    """Starlette routes HEAD with GET: the pages that also take a POST must not read it as
    one (a HEAD of the re-run page was a 500, of the sign-in page a refused sign-in)."""
    await shop.send("msg_1")
    async with client_of(console) as client:
        assert (await client.head("/login")).status_code == 200
        await sign_in(client, TOKEN, "Ada")
        for path in ("/rerun?provider=shop&id=msg_1", "/bulk", "/receipt?provider=shop&id=msg_1"):
            head, get = await client.head(path), await client.get(path)
            assert head.status_code == get.status_code == 200, (path, head.status_code)
            assert head.content == b""
    assert shop.runs["msg_1"] == 1
    assert await audit_rows(shop.rx.store) == []


async def test_an_expired_session_is_dead(shop: Shop, console: Console) -> None:
    async with client_of(console) as client:
        await sign_in(client, TOKEN, "Ada")
        assert (await client.get("/receipts")).status_code == 200
        async with shop.rx.store.acquire() as conn:
            past = "now() - interval '1 second'" if conn.dialect == "postgresql" else "0"
            await conn.execute(f"UPDATE receiver_console_sessions SET expires_at = {past}")
        assert (await client.get("/receipts")).status_code == 401
        # The next sign-in sweeps the expired row away.
        await sign_in(client, TOKEN, "Ada")
        async with shop.rx.store.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM receiver_console_sessions") == 1


async def test_ending_all_sessions_signs_everyone_out(shop: Shop, console: Console) -> None:
    async with client_of(console) as ada, client_of(console) as grace:
        await sign_in(ada, TOKEN, "Ada")
        await sign_in(grace, TOKEN, "Grace")
        listed = await ada.get("/sessions")
        assert "Ada" in listed.text
        assert "Grace" in listed.text
        ended = await ada.post("/sessions/end", data={"csrf": csrf_of(listed.text)})
        assert ended.status_code == 303
        assert (await ada.get("/receipts")).status_code == 401
        assert (await grace.get("/receipts")).status_code == 401
    (row,) = await audit_rows(shop.rx.store)
    assert (row["actor"], row["action"], row["detail"]) == (
        "Ada",
        "end sessions",
        "2 session(s) ended",
    )


async def test_a_changed_token_ends_the_sessions_it_opened(shop: Shop, console: Console) -> None:
    async with client_of(console) as client:
        await sign_in(client, TOKEN, "Ada")
        cookies = dict(client.cookies)
    other = Console(shop.rx.store, receiver=shop.rx, token=TOKEN + "-rotated")
    async with client_of(other) as client:
        for name, value in cookies.items():
            client.cookies.set(name, value)
        assert (await client.get("/receipts")).status_code == 401


async def test_a_notice_in_the_url_is_never_shown(shop: Shop, console: Console) -> None:
    shop.failing.add("msg_1")
    await shop.send("msg_1")
    shop.failing.clear()
    async with client_of(console) as client:
        await sign_in(client, TOKEN, "Ada")
        crafted = await client.get("/receipt?provider=shop&id=msg_1&msg=Re-run%3A+executed")
        assert "Re-run: executed" not in crafted.text
        assert 'class="notice"' not in crafted.text
        done = await client.post("/replay", data=await replay_form(client, "msg_1"))
        assert done.status_code == 303
        assert "msg=" not in done.headers["location"]
        assert await notice_after(client, done) == "Replayed: executed (HTTP 200, fence 2)"
        # Shown once: the next page has none.
        assert await notice_after(client, done) == ""


async def test_a_console_without_sign_in_keeps_notices_per_browser(shop: Shop) -> None:
    shop.failing.add("msg_1")
    await shop.send("msg_1")
    shop.failing.clear()
    console = shop.rx.console()
    async with client_of(console) as client, client_of(console) as other:
        form = await replay_form(client, "msg_1")
        done = await client.post("/replay", data={**form, "operator": "Grace"})
        assert done.status_code == 303
        assert "msg=" not in done.headers["location"]
        shown = await other.get(done.headers["location"])  # another browser: no notice
        assert 'class="notice"' not in shown.text
        assert await notice_after(client, done) == "Replayed: executed (HTTP 200, fence 2)"


async def test_operators_sign_in_with_their_own_tokens_and_roles(shop: Shop) -> None:
    shop.failing.add("msg_1")
    await shop.send("msg_1")
    shop.failing.clear()
    console = Console(shop.rx.store, receiver=shop.rx, operators=OPERATORS)
    async with client_of(console) as bob, client_of(console) as ada:
        login = await bob.get("/login")
        assert 'name="name"' not in login.text  # the token says who signs in
        assert (await sign_in(bob, TOKEN, "Mallory")).status_code == 401  # no shared token
        assert (await sign_in(bob, BOB)).status_code == 303
        page = await bob.get("/receipt?provider=shop&id=msg_1")
        assert "signed in as Bob" in page.text
        assert "read-only" in page.text
        assert 'action="/replay"' not in page.text
        refused = await bob.post("/replay", data=await replay_form(bob, "msg_1"))
        assert refused.status_code == 403
        assert "read-only" in refused.text
        assert await state_of(shop.rx.store, "shop", "msg_1") == ("released", 1)

        await sign_in(ada, ADA)
        done = await ada.post("/replay", data=await replay_form(ada, "msg_1"))
        assert done.status_code == 303
    (row,) = await audit_rows(shop.rx.store)
    assert (row["actor"], row["action"], row["outcome"]) == ("Ada", "replay", "executed")


async def test_a_shared_token_and_operators_together(shop: Shop) -> None:
    console = Console(shop.rx.store, receiver=shop.rx, token=TOKEN, operators=OPERATORS[:1])
    async with client_of(console) as client:
        assert 'name="name"' in (await client.get("/login")).text
        assert (await sign_in(client, TOKEN)).status_code == 403  # the shared token: a name
        assert (await sign_in(client, TOKEN, "Grace")).status_code == 303
        assert "signed in as Grace" in (await client.get("/")).text


@pytest.mark.parametrize(
    ("operators", "why"),
    [
        ([{"name": "a", "token": "short"}], "at least 16"),
        ([{"name": "", "token": ADA}], "a name of its own"),
        ([{"name": "a", "token": ADA}, {"name": "a", "token": BOB}], "a name of its own"),
        ([{"name": "a", "token": ADA, "role": "admin"}], "not one of"),
        ([{"name": "a", "token_sha256": "abc"}], "64 hex digits"),
        ([{"name": "a"}], "has no token"),
        ([{"name": "a", "token": ADA}, {"name": "b", "token": ADA}], "the same token"),
    ],
)
def test_operators_are_checked_at_start(operators: list[dict[str, str]], why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        Console("sqlite:///unused.db", operators=operators)


def test_the_cli_ends_every_session(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    shop = Shop(url)

    async def setup() -> None:
        async with shop.rx:
            console = Console(shop.rx.store, receiver=shop.rx, token=TOKEN)
            async with client_of(console) as client:
                await sign_in(client, TOKEN, "Ada")
                assert (await client.get("/")).status_code == 200

    async def live() -> int:
        async with shop.rx.store, shop.rx.store.acquire() as conn:
            return int(await conn.fetchval("SELECT count(*) FROM receiver_console_sessions"))

    asyncio.run(setup())
    assert asyncio.run(live()) == 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    ended = subprocess.run(
        [RECEIVER, "console", "--store", url, "--end-sessions"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ended.returncode == 0, ended.stderr
    assert re.search(r"ended 1 console session", ended.stdout)
    assert asyncio.run(live()) == 0

    async def audit() -> list[dict[str, object]]:
        async with shop.rx.store:
            return await audit_rows(shop.rx.store)

    (row,) = asyncio.run(audit())
    assert row["action"] == "end sessions"
    assert str(row["actor"]).endswith("(receiver console --end-sessions)")


@pytest.mark.parametrize(
    ("target", "lands"),
    [
        ("/receipts?state=released", "/receipts?state=released"),
        ("//evil.example/", "/"),
        ("/\\evil.example/", "/"),  # a browser reads the backslash as a slash: another host
        ("https://evil.example/", "/"),
        ("/receipts\n", "/"),
        ("/" + "a" * 3000, "/"),
    ],
)
async def test_sign_in_goes_only_to_a_page_of_the_console(
    shop: Shop, console: Console, target: str, lands: str
) -> None:
    async with client_of(console) as client:
        login = await client.get("/login")
        form = {"csrf": csrf_of(login.text), "next": target, "token": TOKEN, "name": "Ada"}
        signed = await client.post("/login", data=form)
    assert signed.status_code == 303, signed.text[:300]
    assert signed.headers["location"] == lands


async def test_a_sign_in_form_that_cannot_be_read_says_so(shop: Shop, console: Console) -> None:
    async with client_of(console) as client:
        login = await client.get("/login")
        form = {"csrf": csrf_of(login.text), "next": "/", "token": TOKEN, "name": "Ada\x00"}
        refused = await client.post("/login", data=form)
    assert refused.status_code == 400
    assert "NUL" in refused.text
    assert "CSRF token" not in refused.text  # the form was not read, not forged
