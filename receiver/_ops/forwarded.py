"""The client's address behind trusted proxies: X-Forwarded-For and X-Real-IP.

A gateway such as Kong appends the address of its own peer to whatever X-Forwarded-For the client
sent, and sets X-Real-IP. Anyone can write these headers, so they count only when the request
comes from a proxy we trust, and only the entries such proxies added. Walking X-Forwarded-For from
the right, each entry is one hop further from us; the first entry that is not itself a trusted
proxy is the client, and everything to its left was written by the client and is ignored (MDN,
"X-Forwarded-For: selecting an IP address"). A request from an untrusted peer is taken at its
word: the TCP peer is the client, whatever headers it sent.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from starlette.datastructures import Headers

from .._exceptions import ConfigurationError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_PORT = re.compile(r"[0-9]{1,5}")


class TrustedProxies:
    """The proxies whose forwarding headers are believed: addresses or networks such as
    ``"127.0.0.1"``, ``"10.0.0.0/8"``, ``"fd00::/8"``, or one comma-separated string. Empty (the
    default) trusts nobody: the client is always the TCP peer."""

    def __init__(self, proxies: Iterable[str] | str = ()) -> None:
        if isinstance(proxies, str):
            proxies = proxies.split(",")
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for item in proxies:
            text = item.strip() if isinstance(item, str) else item
            if text == "":
                continue  # "a,,b" or a trailing comma in an environment variable
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except (ValueError, TypeError):
                raise ConfigurationError(
                    f"trusted_proxies: {item!r} is not an IP address or network; give the "
                    f"addresses your proxies connect from, e.g. '10.0.0.5', '10.0.0.0/8' or '::1'"
                ) from None
        self.networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: IPAddress) -> bool:
        address = _unmapped(address)
        return any(address in network for network in self.networks)

    def client(self, peer: str | None, headers: Headers) -> str | None:
        """The client address of a request whose TCP peer is ``peer``. Never raises: a header
        that is not an address is evidence of nothing."""
        if peer is None or not self.networks:
            return peer  # nobody trusted (the default): the TCP peer is the client, as given
        reached = parse(peer)
        if reached is None:
            return peer  # not an IP peer (a Unix socket, say): nothing to check it against
        if not self.trusts(reached):
            return _text(reached)
        hops = [hop for value in headers.getlist("x-forwarded-for") for hop in value.split(",")]
        if not any(hop.strip() for hop in hops):
            # No chain, e.g. a proxy that only sets X-Real-IP (to its own peer).
            real = parse(headers.get("x-real-ip", ""))
            return _text(real if real is not None else reached)
        for hop in reversed(hops):
            address = parse(hop)
            if address is None:
                # Not an address (e.g. nginx's "unix:"): nothing beyond it can be vouched for,
                # so the client is the last address a trusted proxy reported.
                break
            reached = address
            if not self.trusts(address):
                break
        return _text(reached)

    def __repr__(self) -> str:
        return f"TrustedProxies({[str(n) for n in self.networks]!r})"


def parse(text: str) -> IPAddress | None:
    """An address as proxies write it: ``1.2.3.4``, ``1.2.3.4:5678``, ``2001:db8::1`` or
    ``[2001:db8::1]:5678``. None for anything else."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end != -1 else ""
        if end == -1 or (rest and not (rest[0] == ":" and _PORT.fullmatch(rest[1:]))):
            return None
        text = text[1:end]
    elif text.count(":") == 1:
        text, _, port = text.partition(":")
        if not _PORT.fullmatch(port):
            return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _unmapped(address: IPAddress) -> IPAddress:
    # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _text(address: IPAddress) -> str:
    return str(_unmapped(address))
