"""The console's lists on both stores, through its ASGI app in-process: what they show of a
stored error (masked, as the receipt's page masks it) and how they answer a cursor that is
not one of theirs (400, never a driver's error)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from receiver import Store
from receiver._console import Console
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
