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
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressRefused(Exception):
    """A user URL points where the worker must not send traffic (or, ``retriable``, its name
    does not resolve right now)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


def _forbidden(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (address.is_private or address.is_loopback or address.is_link_local
            or address.is_reserved or address.is_multicast or address.is_unspecified
            or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED))


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, not public


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

    async def check(self, url: str) -> None:
        """Raise EgressRefused unless every address ``url``'s host resolves to may be reached."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressRefused(f"only http(s) URLs with a host are allowed, got {url!r}")
        host = parts.hostname.lower().rstrip(".")
        if host in self.hosts:
            return
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            addresses = await _resolve(host, parts.port or (443 if parts.scheme == "https" else 80))
        for address in addresses:
            if _forbidden(address) and not self._allowed(address):
                raise EgressRefused(
                    f"{host} resolves to {address}, a private/loopback/link-local address; "
                    "allow it in SGW_EGRESS_ALLOW if it is meant to be reached"
                )


async def _resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EgressRefused(f"cannot resolve {host}: {exc.strerror}", retriable=True) from None
    return [ipaddress.ip_address(info[4][0]) for info in infos]
