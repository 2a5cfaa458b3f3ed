"""Talking to the upstream: which headers cross the proxy, the keyed request (buffered, so that
its answer can be stored), and the pass-through request (streamed both ways).

What matters for exactly once is *when* a failure happened. :class:`NotSent` means the upstream
cannot have seen the request (no connection, no TLS session, a pool timeout): the claim may be
given back. :class:`Unknown` means it may have (a timeout or a broken connection after the first
byte went out): the attempt is kept for reconcile, never forwarded again blindly.
"""

from __future__ import annotations

import re
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx
from starlette.types import Message, Receive, Scope, Send

from .._exceptions import ConfigurationError, ReceiverError
from .._ops.forwarded import TrustedProxies, parse

# RFC 9110 section 7.6.1: connection-specific fields, never forwarded; plus the ones the proxy
# sets itself (host, content-length) and a client's Expect (the proxy has the whole body).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_REQUEST_DROPPED = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
# Date and Server too: the server the proxy runs on (uvicorn, as every ASGI server) adds its
# own, and forwarded they came twice (RFC 9110 section 6.6.1: one Date per message).
_RESPONSE_DROPPED = HOP_BY_HOP | {b"content-length", b"date", b"server"}


class NotSent(ReceiverError):
    """The request never reached the upstream (``kind``: connect, connect_timeout, pool)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(f"the upstream was not reached ({kind})")


class Unknown(ReceiverError):
    """The request may have reached the upstream, and no answer came back (``kind``: timeout,
    read, write, protocol)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(f"the upstream's answer was lost ({kind}); it may have acted")


class AnswerTooLarge(ReceiverError):
    """The upstream answered with more than the proxy stores: it acted, its answer is lost."""


def check_upstream(upstream: str) -> None:
    """Refuse an upstream base URL requests cannot be forwarded to (ConfigurationError)."""
    try:
        url = httpx.URL(upstream)
        port = url.port
    # The messages never hold the URL: it may carry credentials (https://user:pass@host).
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigurationError(f"upstream is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigurationError("upstream must be an http:// or https:// URL with a host")
    if port is not None and not 0 < port < 65536:
        raise ConfigurationError(f"upstream's port must be 1-65535, not {port}")
    if url.query or url.fragment or "?" in upstream or "#" in upstream:
        raise ConfigurationError(
            "upstream is a base URL: request paths are appended to it, so it takes no query or "
            "fragment"
        )


def client_for(
    upstream: str, *, timeout: float, connect_timeout: float, verify: bool | str | ssl.SSLContext
) -> httpx.AsyncClient:
    """The proxy's client: no redirects followed (a 3xx is the upstream's answer), no proxies
    from the environment, TLS checked against the system's CAs, a CA file, or a context."""
    if isinstance(verify, str):
        try:
            verify = ssl.create_default_context(cafile=verify)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"cannot read the upstream CA file {verify!r}: {exc}") from exc
    return httpx.AsyncClient(
        base_url=upstream,
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        verify=verify,
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
    )


def request_headers(
    scope: Scope, extra: Sequence[tuple[bytes, bytes]], trusted: TrustedProxies
) -> list[tuple[bytes, bytes]]:
    """The client's headers as the upstream gets them: hop-by-hop ones (and those the client's
    Connection header names) dropped, the client's Idempotency-Key replaced by ``extra``, and
    X-Forwarded-For/-Proto/-Host set (:func:`forwarding`)."""
    raw: list[tuple[bytes, bytes]] = scope["headers"]
    named = {
        token.strip().lower()
        for name, value in raw
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    dropped = _REQUEST_DROPPED | named | {b"idempotency-key"} | {n.lower() for n, _ in extra}
    out = [(n, v) for n, v in raw if n.lower() not in dropped]
    return [*forwarding(scope, out, trusted), *extra]


def _claims_forwarding(name: bytes) -> bool:
    lowered = name.lower()
    return lowered.startswith(b"x-forwarded-") or lowered in (b"forwarded", b"x-real-ip")


def forwarding(
    scope: Scope, headers: list[tuple[bytes, bytes]], trusted: TrustedProxies
) -> list[tuple[bytes, bytes]]:
    """``headers`` with the forwarding headers the upstream believes: what the proxy saw (its
    TCP peer, the scheme and Host it was reached by). Anyone can write those headers, so a
    client's own (X-Forwarded-*, Forwarded, X-Real-IP) are dropped, unless the peer is one of
    the ``trusted`` proxies: then they are what that proxy saw, passed on, its address appended
    to X-Forwarded-For, and Proto and Host added only where it sent none (as the webhook app
    believes X-Forwarded-For only from its trusted proxies, receiver/_ops/forwarded.py)."""
    client = scope.get("client")
    peer = str(client[0]) if client else None
    address = None if peer is None else parse(peer)
    vouched = address is not None and trusted.trusts(address)
    out = headers if vouched else [(n, v) for n, v in headers if not _claims_forwarding(n)]
    if peer is not None:
        chain = [v for n, v in out if n.lower() == b"x-forwarded-for"]
        out = [(n, v) for n, v in out if n.lower() != b"x-forwarded-for"]
        out.append((b"x-forwarded-for", b", ".join([*chain, peer.encode()])))
    if not any(n.lower() == b"x-forwarded-proto" for n, _ in out):
        out.append((b"x-forwarded-proto", str(scope.get("scheme", "http")).encode()))
    host = next((v for n, v in scope["headers"] if n.lower() == b"host"), b"")
    if host and not any(n.lower() == b"x-forwarded-host" for n, _ in out):
        out.append((b"x-forwarded-host", host))
    return out


def response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    raw = response.headers.raw
    named = {
        token.strip().lower()
        for name, value in raw
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return [(n.lower(), v) for n, v in raw if n.lower() not in _RESPONSE_DROPPED | named]


class BadTarget(ReceiverError):
    """The request cannot be forwarded: its path holds a dot segment or a control character, or
    is longer than a URL may be, or a header cannot be sent. Nothing was sent; the client gets a
    400."""


# A path's segments as an upstream may read them: split at "/", and at "\\" (some servers
# read it as "/"), written or percent-encoded.
_SEPARATOR = re.compile(r"/|\\|%2f|%5c", re.IGNORECASE)


def _leaves_base(path: str) -> bool:
    """Whether a segment of ``path`` is "." or "..", as written or percent-encoded, or with
    ";parameters" (which some servers strip): resolved by the client library or the upstream,
    it would reach a path outside the upstream's base URL."""
    return any(
        urllib.parse.unquote(segment.partition(";")[0]) in (".", "..")
        for segment in _SEPARATOR.split(path)
    )


# RFC 9110 section 5: a field name is a token; a value has no leading or trailing whitespace
# and no control character but a tab. The client library refuses anything else, before sending.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(
    rb"(?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?"
)


def header_name(name: str, option: str = "key_header") -> bytes:
    """A header name the proxy sets or reads (``option`` names the setting), lowercased;
    ConfigurationError if it is not a token."""
    encoded = name.lower().encode("latin-1", "replace") if isinstance(name, str) else b""
    if not _FIELD_NAME.fullmatch(encoded):
        raise ConfigurationError(f"{option} must be a header name (a token), not {name!r}")
    return encoded


def check_headers(scope: Scope) -> None:
    """Raise BadTarget for a request header that cannot be sent on to the upstream (reached
    only through an ASGI app or server that let it through: the HTTP servers refuse them)."""
    for name, value in scope["headers"]:
        if not _FIELD_NAME.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise BadTarget("a request header's name or value cannot be forwarded")
        if name.lower() == b"content-length" and not (value.isdigit() and len(value) < 19):
            raise BadTarget("the request's Content-Length is not a number")


def _ascii(raw: bytes) -> str:
    """Bytes past ASCII percent-encoded as they are (the URL library would encode the
    characters they decode to, a second time)."""
    if raw.isascii():
        return raw.decode("ascii")
    return "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in raw)


def target(upstream: str, scope: Scope) -> httpx.URL:
    """The upstream URL a request goes to: the client's path and query, as the client wrote
    them, appended to the upstream's base URL. Raises BadTarget."""
    raw_path = scope.get("raw_path") or scope["path"].encode()
    path = _ascii(bytes(raw_path)).lstrip("/")
    query = _ascii(bytes(scope.get("query_string", b"")))
    if _leaves_base(path):
        raise BadTarget("the request path holds a '.' or '..' segment")
    if "?" in path:  # a raw path holds no query (no HTTP server puts one there)
        raise BadTarget("the request path holds a '?'")
    # A '#' would end the URL there (a fragment is never sent): it is kept, escaped.
    path, query = path.replace("#", "%23"), query.replace("#", "%23")
    try:
        return httpx.URL(upstream + (f"{path}?{query}" if query else path))
    except httpx.InvalidURL as exc:
        raise BadTarget(f"the request path cannot be forwarded: {exc}") from None


async def _body(receive: Receive, first: Message | None) -> AsyncIterator[bytes]:
    """The client's body as it arrives (``first``: its first message, already received)."""
    message = first if first is not None else await receive()
    while message["type"] == "http.request":
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
        message = await receive()


@dataclass(frozen=True, slots=True)
class Exchange:
    """A keyed request's round trip: the upstream's status, headers and whole body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


async def exchange(
    client: httpx.AsyncClient,
    url: httpx.URL,
    scope: Scope,
    body: bytes,
    extra: Sequence[tuple[bytes, bytes]],
    max_size: int,
    trusted: TrustedProxies,
) -> Exchange:
    """Send a keyed request (its body already read) and read the whole answer, raw (a
    compressed answer stays compressed: it is stored and replayed as the upstream sent it)."""
    request = client.build_request(
        scope["method"], url, headers=request_headers(scope, extra, trusted), content=body
    )
    try:
        response = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
        raise NotSent("connect") from exc
    except httpx.LocalProtocolError as exc:  # refused before a byte went out
        raise NotSent("request") from exc
    except httpx.ConnectTimeout as exc:
        raise NotSent("connect_timeout") from exc
    except httpx.PoolTimeout as exc:
        raise NotSent("pool") from exc
    except httpx.TimeoutException as exc:
        raise Unknown("timeout") from exc
    except httpx.WriteError as exc:
        raise Unknown("write") from exc
    except httpx.TransportError as exc:
        raise Unknown("read") from exc
    try:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > max_size:
                raise AnswerTooLarge(f"the upstream's answer exceeds {max_size} bytes")
            chunks.append(chunk)
    except httpx.TimeoutException as exc:
        raise Unknown("timeout") from exc
    except httpx.TransportError as exc:
        raise Unknown("read") from exc
    finally:
        await response.aclose()
    return Exchange(response.status_code, response_headers(response), b"".join(chunks))


async def stream(
    client: httpx.AsyncClient,
    url: httpx.URL,
    scope: Scope,
    receive: Receive,
    send: Send,
    trusted: TrustedProxies,
) -> None:
    """A request that needs no key, streamed both ways without buffering either body."""
    framing: list[tuple[bytes, bytes]] = scope["headers"]
    # The upstream sees the body framed as the client sent it: by its Content-Length (some
    # upstreams refuse chunked request bodies), chunked, or not at all. A GET, HEAD or DELETE
    # sent on with an empty chunked body is refused by upstreams that refuse a body on them.
    sized = [(n, v) for n, v in framing if n.lower() == b"content-length"][:1]
    content: AsyncIterator[bytes] | None
    if sized or any(n.lower() == b"transfer-encoding" for n, _ in framing):
        content = _body(receive, None)
    else:
        # No framing: no body over HTTP/1.1; over HTTP/2 one may still come, so look.
        first = await receive()
        has_body = first.get("body") or first.get("more_body", False)
        content = _body(receive, first) if has_body else None
    request = client.build_request(
        scope["method"], url, headers=request_headers(scope, sized, trusted), content=content
    )
    try:
        response = await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        raise Unknown("timeout") from exc
    except httpx.TransportError as exc:
        raise NotSent("connect") from exc
    try:
        headers = response_headers(response)
        length = response.headers.get("content-length")
        if length is not None:
            headers.append((b"content-length", length.encode()))
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError:
            # The answer has begun: it can only end short, which the client sees as such.
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await response.aclose()
