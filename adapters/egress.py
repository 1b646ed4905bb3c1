"""The private-network guard for URLs that users configure (external scorers, webhooks).

A user URL must not become a way into the operator's network: a host that resolves to a
loopback, private, link-local (cloud metadata lives at 169.254.169.254), shared, reserved or
multicast address is refused, unless the operator allows it by name or network in
``SGW_EGRESS_ALLOW``. Every address a name resolves to is checked, so a name with one public
and one private address is refused too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from scorer_groups.models import check_url_shape
from scoring.errors import ScoringError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressRefused(ScoringError):
    """A user URL points where the worker must not send traffic (or, ``retriable``, its name
    does not resolve right now)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 transition form carries (mapped, 6to4, Teredo, NAT64), if any:
    each of them reaches that IPv4 host, so it is checked as that host."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client: where the traffic is delivered
    if any(address in net for net in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _forbidden(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None and _forbidden(embedded):
            return True
    return (address.is_private or address.is_loopback or address.is_link_local
            or address.is_reserved or address.is_multicast or address.is_unspecified
            or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED))


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, not public


@dataclass(frozen=True)
class Target:
    """A checked request target. A name is pinned to the address that passed the check: the
    request goes to that address, with the name in the Host header and in TLS (SNI and the
    certificate check), so a second DNS answer (rebinding) cannot send it somewhere else."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


def _pinned(parts: SplitResult, host: str, address: IPAddress) -> Target:
    shown = f"[{address}]" if address.version == 6 else str(address)
    netloc = shown + (f":{parts.port}" if parts.port else "")
    host_header = host + (f":{parts.port}" if parts.port else "")
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return Target(urlunsplit(parts._replace(netloc=netloc)), {"Host": host_header}, extensions)


@dataclass(frozen=True)
class EgressPolicy:
    """Which private destinations the operator allows (hosts by name, or networks)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, items: list[str]) -> EgressPolicy:
        hosts, networks = set(), []
        for item in items:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                hosts.add(item.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def _allowed(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)

    async def check(self, url: str) -> Target:
        """Raise EgressRefused unless every address ``url``'s host resolves to may be reached;
        return the request pinned to the address that was checked (see ``Target``)."""
        try:  # every parse error is a refusal: a stored URL must never raise anything else
            check_url_shape(url)
            parts = urlsplit(url)
            host = (parts.hostname or "").lower().rstrip(".")
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise EgressRefused(f"url refused: {exc}") from None
        if host in self.hosts:
            return Target(url)  # trusted by name: the operator vouches for whatever it resolves to
        try:
            addresses = [ipaddress.ip_address(host)]
            literal = True
        except ValueError:
            addresses = await _resolve(host, port)
            literal = False
        for address in addresses:
            if _forbidden(address) and not self._allowed(address):
                raise EgressRefused(
                    f"{host} resolves to {address}, a private/loopback/link-local address; "
                    "allow it in SGW_EGRESS_ALLOW if it is meant to be reached"
                )
        return Target(url) if literal else _pinned(parts, host, addresses[0])


async def _resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EgressRefused(f"cannot resolve {host}: {exc.strerror}", retriable=True) from None
    return [ipaddress.ip_address(info[4][0]) for info in infos]
