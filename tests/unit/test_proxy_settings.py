"""The idempotency proxy's settings and targets: an upstream it could not forward to, or a CA
file it cannot read, is refused when the proxy is made (not on the first request, where the
key would be left as if the upstream may have acted); a request path is appended to the base
URL as written, and one with a dot segment or a control character cannot be forwarded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from receiver import ConfigurationError, IdempotencyProxy, SQLiteStore
from receiver._proxy.forward import BadTarget, target


@pytest.mark.parametrize(
    ("upstream", "says"),
    [
        ("http://[::1", "not a URL"),
        ("http://api.test:99999", "port must be 1-65535"),
        ("http://api.test:0", "port must be 1-65535"),
        ("ftp://api.test", "http:// or https://"),
        ("http://", "http:// or https://"),
        ("api.test/v1", "http:// or https://"),
        ("http://api.test/v1?tenant=1", "takes no query"),
        ("http://api.test/v1#top", "takes no query"),
        ("http://api\x00.test/", "not a URL"),
    ],
)
def test_an_upstream_it_cannot_forward_to_is_refused(
    tmp_path: Path, upstream: str, says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says) as refused:
        IdempotencyProxy(upstream, store=SQLiteStore(tmp_path / "keys.db"))
    assert "api.test" not in str(refused.value)  # never the URL: it may carry credentials


def test_a_ca_file_it_cannot_read_is_refused_when_the_proxy_is_made(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "keys.db")
    with pytest.raises(ConfigurationError, match="cannot read the upstream CA file"):
        IdempotencyProxy("https://api.test", store=store, verify=str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="cannot read the upstream CA file"):
        IdempotencyProxy("https://api.test", store=store, verify=str(tmp_path / "junk.pem"))


def request(raw_path: bytes, query: bytes = b"") -> dict[str, Any]:
    return {"path": raw_path.decode("latin-1"), "raw_path": raw_path, "query_string": query}


@pytest.mark.parametrize(
    ("raw_path", "query", "url"),
    [
        (b"/payments", b"", "http://api.test/v1/payments"),
        (b"/payments", b"expand=customer", "http://api.test/v1/payments?expand=customer"),
        (b"/:80", b"", "http://api.test/v1/:80"),
        (b"/a:b/c", b"", "http://api.test/v1/a:b/c"),
        (b"/files/a#b", b"x=1#2", "http://api.test/v1/files/a%23b?x=1%232"),
        (b"/files/%2Fetc", b"", "http://api.test/v1/files/%2Fetc"),
        (b"/.well-known/x", b"", "http://api.test/v1/.well-known/x"),
        (b"/v...x/..y", b"", "http://api.test/v1/v...x/..y"),
        (b"/caf\xc3\xa9", b"", "http://api.test/v1/caf%C3%A9"),
    ],
)
def test_the_path_and_query_are_appended_as_written(
    raw_path: bytes, query: bytes, url: str
) -> None:
    assert str(target("http://api.test/v1/", request(raw_path, query))) == url


@pytest.mark.parametrize(
    "raw_path",
    [
        b"/..",
        b"/payments/../admin",
        b"/./payments",
        b"/payments/%2e%2E/admin",
        b"/%2E/x",
        b"/a/.%2e/b",
        b"/a/..\\b",
        b"/a/..;x=1/b",
        b"/a/.;/b",
        b"/a%2F..%2Fb",
        b"/a%5c..%5cb",
        b"/..?",
        b"/pay\x7fments",
        b"/pay\x00ments",
        b"/" + b"x" * 70_000,
    ],
)
def test_a_path_that_would_leave_the_base_or_cannot_be_sent_is_refused(raw_path: bytes) -> None:
    with pytest.raises(BadTarget):
        target("http://api.test/v1/", request(raw_path))
