"""The client address behind trusted proxies (receiver/_ops/forwarded.py).

Kong appends its peer's address to whatever X-Forwarded-For the client sent and sets X-Real-IP;
only what trusted proxies added counts, and nothing an untrusted peer sends does. The last tests
go through a real Receiver (SQLite in a temp file) whose handler answers ``event.client``, with
garbage headers that must never give a 500.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from receiver import ConfigurationError, Event, Provider, Receiver
from receiver._ops.forwarded import TrustedProxies, parse
from receiver._store.base import Connection
from tests.support import PROVIDER, SECRET, body_of, signed

KONG = TrustedProxies(["127.0.0.1", "10.0.0.0/8", "::1", "fd00::/8"])


def client(peer: str | None, *pairs: tuple[str, str], proxies: TrustedProxies = KONG) -> str | None:
    raw = [(name.lower().encode(), value.encode("latin-1")) for name, value in pairs]
    return proxies.client(peer, Headers(raw=raw))


def xff(value: str) -> tuple[str, str]:
    return ("X-Forwarded-For", value)


def real_ip(value: str) -> tuple[str, str]:
    return ("X-Real-IP", value)


# -- who is trusted ------------------------------------------------------------------------------


def test_nobody_is_trusted_by_default() -> None:
    nobody = TrustedProxies()
    assert not nobody
    assert client("127.0.0.1", xff("203.0.113.9"), real_ip("203.0.113.9"), proxies=nobody) == (
        "127.0.0.1"
    )


def test_an_untrusted_peer_is_the_client_whatever_it_sends() -> None:
    headers = (xff("10.0.0.2, 127.0.0.1"), real_ip("198.51.100.1"))
    assert client("203.0.113.9", *headers) == "203.0.113.9"
    assert client("2001:db8::9", *headers) == "2001:db8::9"


def test_the_proxy_appended_entry_is_the_client() -> None:
    assert client("127.0.0.1", xff("203.0.113.9")) == "203.0.113.9"
    assert client("127.0.0.1", xff("203.0.113.9"), real_ip("203.0.113.9")) == "203.0.113.9"


def test_a_spoofed_chain_is_ignored() -> None:
    # The client wrote "6.6.6.6, 127.0.0.1" (pretending to come through our own proxy); Kong
    # appended the real peer, 203.0.113.9. Only that last entry was written by a trusted proxy.
    assert client("127.0.0.1", xff("6.6.6.6, 127.0.0.1, 203.0.113.9")) == "203.0.113.9"
    assert client("127.0.0.1", xff("6.6.6.6"), xff("203.0.113.9")) == "203.0.113.9"


def test_several_trusted_hops_are_walked() -> None:
    # load balancer 10.0.0.2 -> Kong 10.0.0.5 -> receiver: both trusted.
    assert client("10.0.0.5", xff("6.6.6.6, 203.0.113.9, 10.0.0.2")) == "203.0.113.9"
    # The same chain as two header lines is one list, in order.
    assert client("10.0.0.5", xff("6.6.6.6, 203.0.113.9"), xff("10.0.0.2")) == "203.0.113.9"


def test_a_chain_of_trusted_proxies_only_gives_the_first_of_them() -> None:
    assert client("127.0.0.1", xff("10.1.2.3, 10.0.0.2")) == "10.1.2.3"


def test_x_real_ip_counts_only_without_a_chain_and_only_from_a_trusted_peer() -> None:
    assert client("127.0.0.1", real_ip("203.0.113.9")) == "203.0.113.9"
    assert client("127.0.0.1", xff(" , "), real_ip("203.0.113.9")) == "203.0.113.9"
    assert client("203.0.113.1", real_ip("198.51.100.1")) == "203.0.113.1"
    # With a chain, the chain decides: a client-sent X-Real-IP passed through is not believed.
    assert client("127.0.0.1", xff("203.0.113.9"), real_ip("6.6.6.6")) == "203.0.113.9"


# -- IPv6 and the forms proxies write ------------------------------------------------------------


def test_ipv6() -> None:
    assert client("::1", xff("2001:db8::7")) == "2001:db8::7"
    assert client("fd00::5", xff("2001:DB8:0:0::7, fd00::9")) == "2001:db8::7"  # canonical
    assert client("::1", xff("[2001:db8::7]:4711")) == "2001:db8::7"
    assert client("::1", xff("[2001:db8::7]")) == "2001:db8::7"
    assert client("2001:db8::1", xff("203.0.113.9")) == "2001:db8::1"


def test_ipv4_mapped_peers_are_ipv4() -> None:
    # A dual-stack listener reports 127.0.0.1 as ::ffff:127.0.0.1.
    assert client("::ffff:127.0.0.1", xff("203.0.113.9")) == "203.0.113.9"
    assert client("::ffff:203.0.113.1", xff("198.51.100.1")) == "203.0.113.1"


def test_ports_are_dropped() -> None:
    assert client("127.0.0.1", xff("203.0.113.9:1234")) == "203.0.113.9"


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "unknown",  # RFC 7239's word for it
        "_hidden",  # an RFC 7239 obfuscated identifier
        "unix:",  # nginx's $remote_addr on a Unix socket
        "example.com",
        "203.0.113",
        "203.0.113.9.1",
        "0203.0.113.9",  # leading zeros: octal to some parsers, refused
        "203.0.113.9:",
        "203.0.113.9:http",
        "203.0.113.9:123456",
        "[2001:db8::7",
        "[2001:db8::7]x",
        "[2001:db8::7]:",
        "[203.0.113.9]:80x",
        "2001:db8::7:80:90:100:200:300",
        "\u0661\u0662\u0667.0.0.1",  # Arabic-Indic digits
        "1.2.3.4\x00",
        "\xff\xfe",
        "9" * 10_000,
    ],
)
def test_garbage_is_no_address(text: str) -> None:
    assert parse(text) is None


def test_garbage_in_the_chain_stops_the_walk_at_the_last_address_vouched_for() -> None:
    # Left of the client: ignored like any client-written entry.
    assert client("127.0.0.1", xff("garbage, 203.0.113.9")) == "203.0.113.9"
    # Right-most: the trusted peer is all we know.
    assert client("127.0.0.1", xff("203.0.113.9, garbage")) == "127.0.0.1"
    assert client("127.0.0.1", xff("203.0.113.9,")) == "127.0.0.1"
    # Behind a trusted hop (a load balancer that had a Unix-socket peer): that hop.
    assert client("127.0.0.1", xff("203.0.113.9, unix:, 10.0.0.2")) == "10.0.0.2"
    assert client("127.0.0.1", real_ip("garbage")) == "127.0.0.1"


def test_a_peer_that_is_no_ip_address_is_passed_through() -> None:
    assert client(None, xff("203.0.113.9")) is None
    assert client("unix-socket", xff("203.0.113.9")) == "unix-socket"


@given(
    peer=st.sampled_from(["127.0.0.1", "10.9.8.7", "::1", "203.0.113.1", "2001:db8::1"]),
    values=st.lists(st.text(st.characters(max_codepoint=255), max_size=60), max_size=4),
    real=st.none() | st.text(st.characters(max_codepoint=255), max_size=40),
)
def test_never_raises_and_never_invents_an_address(
    peer: str, values: list[str], real: str | None
) -> None:
    pairs = [xff(v) for v in values] + ([real_ip(real)] if real is not None else [])
    found = client(peer, *pairs)
    assert found is not None
    address = parse(found)
    assert address is not None
    if found != peer:
        assert KONG.trusts(parse(peer))  # type: ignore[arg-type]
        assert any(found == str(parse(hop)) for v in values for hop in v.split(",")) or (
            real is not None and found == str(parse(real))
        )


# -- configuration -------------------------------------------------------------------------------


def test_a_comma_separated_string_is_a_list() -> None:
    proxies = TrustedProxies("127.0.0.1, 10.0.0.0/8,")
    assert [str(n) for n in proxies.networks] == ["127.0.0.1/32", "10.0.0.0/8"]


@pytest.mark.parametrize("bad", ["kong.internal", "10.0.0.0/33", "300.1.1.1", "*"])
def test_what_is_not_an_address_is_refused_at_start_up(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="trusted_proxies"):
        Receiver("sqlite:///:memory:", trusted_proxies=["127.0.0.1", bad])


def test_host_bits_are_allowed_in_networks() -> None:
    assert TrustedProxies(["10.1.2.3/8"]).trusts(parse("10.200.0.1"))  # type: ignore[arg-type]


# -- through a real Receiver ---------------------------------------------------------------------


@pytest.fixture
async def app(tmp_path: Path) -> Receiver:
    rx = Receiver(
        f"sqlite:///{tmp_path}/r.db",
        [Provider(PROVIDER, [SECRET])],
        trusted_proxies=["127.0.0.1", "::1"],
        sweep_interval=None,
    )

    @rx.on("order.*")
    async def echo(event: Event, tx: Connection) -> dict[str, str | None]:
        return {"client": event.client}

    return rx


async def post(rx: Receiver, peer: str, headers: list[tuple[str, str]], n: int) -> httpx.Response:
    body = body_of(order=f"o-{n}")
    transport = httpx.ASGITransport(app=rx, client=(peer, 4711))
    async with rx, httpx.AsyncClient(transport=transport, base_url="http://rx") as http:
        # A list of pairs keeps repeated header lines (two X-Forwarded-For) as they are.
        pairs = [
            (k, v.encode("latin-1")) for k, v in [*signed(f"msg_fwd_{n}", body).items(), *headers]
        ]
        return await http.post(f"/{PROVIDER}", content=body, headers=pairs)


async def test_event_client_through_the_receiver(app: Receiver) -> None:
    spoof = [("x-forwarded-for", "6.6.6.6, 127.0.0.1"), ("x-real-ip", "6.6.6.6")]
    answer = await post(app, "203.0.113.9", spoof, 1)  # straight from the internet
    assert answer.json() == {"client": "203.0.113.9"}
    answer = await post(app, "127.0.0.1", [("x-forwarded-for", "6.6.6.6, 198.51.100.4")], 2)
    assert answer.json() == {"client": "198.51.100.4"}  # through the trusted proxy
    answer = await post(app, "::1", [("x-forwarded-for", "[2001:db8::4]:1234")], 3)
    assert answer.json() == {"client": "2001:db8::4"}


@pytest.mark.parametrize(
    "values",
    [
        [""],
        [","],
        ["garbage"],
        ["unix:, ::1"],
        ["[::1", "]"],
        ["1.2.3.4" + ", 127.0.0.1" * 500],
        ["\xff\xfe\x00\x7f"],
    ],
)
async def test_garbage_forwarding_headers_never_give_a_500(
    app: Receiver, values: list[str]
) -> None:
    headers = [("x-forwarded-for", v) for v in values] + [("x-real-ip", values[0])]
    answer = await post(app, "127.0.0.1", headers, 0)
    assert answer.status_code == 200, answer.text
    assert parse(answer.json()["client"]) is not None
