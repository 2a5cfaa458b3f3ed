"""A request path the proxy cannot forward (a dot segment that would leave the upstream's base
URL, a control character) is answered 400 before its body is read or its key claimed, on the
keyed path and the pass-through path alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Message

from receiver import IdempotencyProxy, SQLiteStore


def scope(raw_path: bytes, method: str = "POST", key: bytes | None = b'"k-1"') -> dict[str, Any]:
    headers = [(b"authorization", b"Bearer t")]
    if key is not None:
        headers.append((b"idempotency-key", key))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": raw_path.decode("latin-1"),
        "raw_path": raw_path,
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("api.test", 80),
    }


@pytest.mark.parametrize(
    ("raw_path", "method", "key"),
    [
        (b"/v1/payments/../admin", "POST", b'"k-1"'),
        (b"/v1/%2e%2e/admin", "POST", b'"k-1"'),
        (b"/v1/pay\x7fments", "POST", b'"k-1"'),
        (b"/v1/../admin", "GET", None),
        (b"/v1/./payments", "POST", None),
    ],
)
async def test_a_path_that_cannot_be_forwarded_is_refused_before_anything_is_claimed(
    tmp_path: Path, raw_path: bytes, method: str, key: bytes | None
) -> None:
    store = SQLiteStore(tmp_path / "keys.db")
    await store.open()
    # Nothing listens on port 9: a request that reached the forwarding step would fail there.
    proxy = IdempotencyProxy("http://127.0.0.1:9/v1", store=store, sweep_interval=None)
    read: list[Message] = []
    sent: list[Message] = []

    async def receive() -> Message:
        message: Message = {"type": "http.request", "body": b"{}", "more_body": False}
        read.append(message)
        return message

    async def send(message: Message) -> None:
        sent.append(message)

    try:
        await proxy(scope(raw_path, method, key), receive, send)
        async with store.acquire() as conn:
            keys = await conn.fetchval("SELECT count(*) FROM receiver_receipts")
    finally:
        await proxy.aclose()
        await store.close()
    assert sent[0]["status"] == 400
    problem = orjson.loads(sent[1]["body"])
    assert problem["type"].endswith("invalid-target")
    assert read == []
    assert keys == 0
