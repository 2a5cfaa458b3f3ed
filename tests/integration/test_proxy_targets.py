"""A request the proxy cannot forward (a path with a dot segment that would leave the upstream's
base URL or a control character, a header the client library would refuse to send) is answered
400 before its body is read or its key claimed, on the keyed path and the pass-through path
alike; and a key's fingerprint is of the path as forwarded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Message

from receiver import IdempotencyProxy, SQLiteStore


def scope(
    raw_path: bytes,
    method: str = "POST",
    key: bytes | None = b'"k-1"',
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> dict[str, Any]:
    headers = [(b"authorization", b"Bearer t"), *extra]
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
    ("raw_path", "method", "key", "extra"),
    [
        (b"/v1/payments/../admin", "POST", b'"k-1"', ()),
        (b"/v1/%2e%2e/admin", "POST", b'"k-1"', ()),
        (b"/v1/pay\x7fments", "POST", b'"k-1"', ()),
        (b"/v1/../admin", "GET", None, ()),
        (b"/v1/./payments", "POST", None, ()),
        (b"/v1/payments", "POST", b'"k-1"', ((b"x-user", b"ada "),)),
        (b"/v1/payments", "POST", b'"k-1"', ((b"x-user", b"a\x00b"),)),
        (b"/v1/payments", "POST", b'"k-1"', ((b"x user", b"ada"),)),
        (b"/v1/payments", "GET", None, ((b"content-length", b"ten"),)),
    ],
)
async def test_a_request_that_cannot_be_forwarded_is_refused_before_anything_is_claimed(
    tmp_path: Path,
    raw_path: bytes,
    method: str,
    key: bytes | None,
    extra: tuple[tuple[bytes, bytes], ...],
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
        await proxy(scope(raw_path, method, key, extra), receive, send)
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


async def test_a_key_is_fingerprinted_by_the_path_it_is_forwarded_to(tmp_path: Path) -> None:
    """/items/a%2Fb and /items/a/b are two upstream paths: the same key on both is a reuse."""
    store = SQLiteStore(tmp_path / "keys.db")
    await store.open()
    # Nothing listens on port 9: the first attempt is not sent, and its key is given back.
    proxy = IdempotencyProxy("http://127.0.0.1:9/v1", store=store, sweep_interval=None)
    statuses = []
    try:
        for raw_path in (b"/items/a%2Fb", b"/items/a/b"):
            sent: list[Message] = []

            async def receive() -> Message:
                return {"type": "http.request", "body": b"{}", "more_body": False}

            async def send(message: Message, sent: list[Message] = sent) -> None:
                sent.append(message)

            request = scope(raw_path)
            request["path"] = "/items/a/b"  # what the server decodes both to
            await proxy(request, receive, send)
            statuses.append(sent[0]["status"])
    finally:
        await proxy.aclose()
        await store.close()
    assert statuses == [502, 422]
