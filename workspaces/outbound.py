"""The one server-side request forgery (SSRF) guard: may the platform connect to this host?

Every place that would reach a URL a user gave (webhook deliveries in ``workspaces.notifications``,
import sources in ``serving.artifacts``) asks ``public_addresses``: the host must not be a
loopback name, must resolve, and every address it resolves to must be public. "Public" is strict:
no loopback, link-local (169.254.169.254, the cloud metadata service), private, reserved,
multicast or unspecified address, nothing outside the global range (shared address space,
documentation ranges), and IPv6 addresses that carry an IPv4 one inside (IPv4-mapped, 6to4,
Teredo, NAT64) are refused when the inner address would be. Numeric spellings of IPv4
(``2130706433``, ``0x7f000001``, ``127.1``) go through the resolver and are checked as the address
they mean. Callers connect to an address this returned, never to a fresh lookup of the name, so a
DNS answer cannot be swapped between the check and the connection.
"""

from __future__ import annotations

import ipaddress
import socket

# Hosts refused by name, before any lookup (a resolver may map them anywhere).
REFUSED_HOSTNAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
# IPv6 prefixes that carry an IPv4 address inside: the embedded address is checked as well.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class OutboundRefused(ValueError):
    """The host may not be connected to; the message says why, naming the host."""


def address_problem(address: Address) -> str | None:
    """Why an address may not be connected to, or None for a public one."""
    embedded: list[ipaddress.IPv4Address] = []
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            embedded.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            embedded.append(address.sixtofour)
        if address.teredo is not None:
            embedded.extend(address.teredo)
        if address in NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    for inner in embedded:
        problem = address_problem(inner)
        if problem:
            return problem
    checks = (
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_private", "a private address"),
        ("is_reserved", "a reserved address"),
        ("is_multicast", "a multicast address"),
        ("is_unspecified", "an unspecified address"),
    )
    for attribute, label in checks:
        if getattr(address, attribute):
            return label
    if not address.is_global:
        return "not a public address"
    return None


def normalised_host(host: str) -> str:
    """The host as it is compared and looked up: no IPv6 brackets, no trailing dot, lower case."""
    return host.strip().strip("[]").rstrip(".").lower()


def resolve(host: str, port: int | None = None) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order, without checking them."""
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise OutboundRefused(f"cannot resolve host '{host}'") from exc
    addresses = list(dict.fromkeys(str(answer[4][0]) for answer in answers))
    if not addresses:
        raise OutboundRefused(f"cannot resolve host '{host}'")
    return addresses


def public_addresses(host: str, port: int | None = None) -> list[str]:
    """The addresses of ``host``, each checked public; ``OutboundRefused`` for a loopback name,
    a host that does not resolve, or any address that is not public (one bad answer is enough:
    the connection could be made to it)."""
    host = normalised_host(host)
    if not host:
        raise OutboundRefused("the URL has no host")
    if host in REFUSED_HOSTNAMES or host.endswith(".localhost"):
        raise OutboundRefused(f"'{host}' is a loopback host")
    addresses = resolve(host, port)
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        problem = address_problem(address)
        if problem:
            raise OutboundRefused(f"'{host}' resolves to {address}, {problem}")
    return addresses
