"""The console's lists on both stores, through its ASGI app in-process: what they show of a
stored error (masked, as the receipt's page masks it) and how they answer a cursor that is
not one of theirs, or a NUL in any parameter (400, never a driver's error)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from receiver import Store
from receiver._console import Console, queries
from receiver._console.pages import ATTENTION
from receiver._ledger import receipts as ledger
from receiver._ledger.receipts import Claim, Claimed, Key

ERROR = "PaymentDeclined: card 4111 1111 1111 1111 refused for Bearer abc.def-ghi"
RECEIPTS = [
    ("shop", "w1", "/receipts"),
    ("action:refund", "acct-1:refund:42:v1", "/actions"),
    ("idem:api", '["alice","k1"]', "/keys"),
]


@pytest.fixture
async def console(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=Console(store)), base_url="http://console.test"
    ) as client:
        yield client


async def released_with(store: Store, provider: str, webhook_id: str, error: str) -> None:
    """A receipt whose attempt failed with ``error`` and was given back for a retry."""
    key = Key(provider, webhook_id)
    async with store.acquire() as conn:
        got = await ledger.claim(conn, Claim(key, b"h" * 32, "t", b"{}", store.now(), 60, 3600))
        assert isinstance(got, Claimed)
        assert await ledger.release(conn, key, got.fence, error, store.now())


async def test_every_list_masks_the_errors_the_receipt_page_masks(
    store: Store, console: httpx.AsyncClient
) -> None:
    for provider, webhook_id, _ in RECEIPTS:
        await released_with(store, provider, webhook_id, ERROR)
    pages = [path for _, _, path in RECEIPTS] + [
        "/attention?list=released",
        "/receipt?provider=shop&id=w1",
    ]
    for path in pages:
        page = await console.get(path)
        assert page.status_code == 200, path
        assert "PaymentDeclined" in page.text, path  # the error is listed...
        assert "•••" in page.text, path  # ...masked
        for secret in ("4111", "1111 1111", "abc.def"):
            assert secret not in page.text, (path, secret)


BAD_CURSORS = [
    "99999999999999999999|shop|w1",  # beyond 64 bits
    "-99999999999999999999|shop|w1",
    "1e400|shop|w1",
    "nan|shop|w1",
    "inf|shop|w1",
    "1|sh\x00op|w1",  # no text in the ledger holds a NUL
    "1|shop|w\x001",
    "1|shop",  # not a cursor at all
    "garbage",
]
BAD_AUDIT = ["99999999999999999999", "-1", "0", "abc", "1.5", "1\x00"]


async def test_a_malformed_cursor_is_a_bad_request_on_every_list(
    store: Store, console: httpx.AsyncClient
) -> None:
    await released_with(store, "shop", "w1", "boom")
    lists = [(p, {}) for p in ("/receipts", "/actions", "/keys")]
    lists += [("/attention", {"list": which}) for which in ATTENTION]
    for path, more in lists:
        for cursor in BAD_CURSORS:
            answer = await console.get(path, params={**more, "after": cursor})
            assert answer.status_code == 400, (path, more, cursor, answer.text[-300:])
            assert "cursor" in answer.text or "NUL" in answer.text
        assert (await console.get(path, params={**more, "after": ""})).status_code == 200
    for before in BAD_AUDIT:
        answer = await console.get("/audit", params={"before": before})
        assert answer.status_code == 400, (before, answer.text[-300:])
    assert (await console.get("/audit", params={"before": "5"})).status_code == 200


async def test_a_cursor_the_console_wrote_still_pages(
    store: Store, console: httpx.AsyncClient
) -> None:
    for n in range(3):
        await released_with(store, "shop", f"w{n}", "boom")
    async with store.acquire() as conn:
        known = await queries.providers(conn)
        first = await queries.list_receipts(conn, known, queries.Filters(), None, None, page=2)
        failed = await queries.attention(conn, "released", "", None, None, page=2)
    for path, page, more in (
        ("/receipts", first, {}),
        ("/attention", failed, {"list": "released"}),
    ):
        assert page.next is not None
        older = await console.get(path, params={**more, "after": page.next.encode()})
        assert older.status_code == 200
        assert "w0" in older.text
        assert "w2" not in older.text


async def test_a_nul_in_any_parameter_is_a_bad_request(
    store: Store, console: httpx.AsyncClient
) -> None:
    await released_with(store, "shop", "w1", "boom")
    for path, params in (
        ("/receipts", {"provider": "sh\x00op"}),
        ("/receipts", {"type": "t\x00"}),
        ("/receipts", {"id": "w\x001"}),
        ("/keys", {"principal": "a\x00", "id": "k"}),
        ("/actions", {"scope": "\x00"}),
        ("/attention", {"provider": "\x00"}),
        ("/receipt", {"provider": "\x00", "id": "w1"}),
    ):
        answer = await console.get(path, params=params)
        assert answer.status_code == 400, (path, params, answer.text[-300:])
    await console.get("/")
    csrf = console.cookies["receiver_console_csrf"]
    form = {"csrf": csrf, "provider": "shop", "id": "w1", "fence": "1", "operator": "Ada"}
    answer = await console.post("/fail", data={**form, "reason": "because\x00"})
    assert answer.status_code == 400
    async with store.acquire() as conn:
        assert await conn.run_all("console_audit_list", None, 10) == []
