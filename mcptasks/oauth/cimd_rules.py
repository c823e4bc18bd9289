"""Which client_id URLs a metadata document may be fetched from, and which
addresses the fetch may connect to.

A Client ID Metadata Document client names an https URL as its ``client_id``
(draft-ietf-oauth-client-id-metadata-document, section 3): https, a host, a
valid port and a path, with no userinfo, no fragment and no ``.`` or ``..``
path segments. The authorization server fetches it on unauthenticated
endpoints, so the host is resolved once and refused outright when any of its
addresses is not globally routable; the fetch then connects to an address
from that list and no other.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import ParseResult, urlparse

from oauth2_provider.cimd import CIMDError

#: RFC 6052's well-known NAT64 prefix: the low 32 bits are an IPv4 address.
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
#: RFC 8215's local-use NAT64 prefix: translates to a network's own IPv4
#: addresses, at a position the site chose, so it is refused as a whole.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
#: RFC 4291's deprecated IPv4-compatible addresses (``::a.b.c.d``): the low 32 bits.
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def client_id_url(client_id: str) -> ParseResult:
    """``client_id`` parsed, or ``CIMDError`` if it breaks a rule of section 3."""
    parsed = urlparse(client_id)
    if parsed.scheme.lower() != "https":
        raise CIMDError("client_id URL must use the https scheme")
    if not parsed.hostname:
        raise CIMDError("client_id URL must contain a host")
    try:
        parsed.port  # noqa: B018 - reading it is the check: out of range raises
    except ValueError as exc:
        raise CIMDError("client_id URL has an invalid port") from exc
    if "@" in parsed.netloc:
        raise CIMDError("client_id URL must not contain a userinfo component")
    if parsed.fragment or "#" in client_id:
        raise CIMDError("client_id URL must not contain a fragment component")
    if not parsed.path:
        raise CIMDError("client_id URL must contain a path component")
    if any(segment in (".", "..") for segment in parsed.path.split("/")):
        raise CIMDError("client_id URL must not contain dot path segments")
    return parsed


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, 6to4, Teredo, NAT64):
    a connection to it reaches them, so they are what must be public."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip in NAT64_WELL_KNOWN or ip in IPV4_COMPATIBLE:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return []


def address_public(address: str) -> bool:
    """Whether ``address`` is globally routable: not private, loopback,
    link-local, shared (CGNAT), reserved, multicast or unspecified, nor an IPv6
    form of such an IPv4 address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_multicast or not ip.is_global:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL_USE:
            return False
        return all(inner.is_global and not inner.is_multicast for inner in embedded_ipv4(ip))
    return True


#: The test every resolved address must pass. Tests that serve documents on
#: loopback widen it (tests/support/cimd_loopback.py); a site has no reason to.
address_allowed: Callable[[str], bool] = address_public


def resolve_public(hostname: str, port: int) -> list[str]:
    """The addresses of ``hostname``, or ``CIMDError`` if it has none or any of
    them fails :data:`address_allowed`. One bad address refuses the whole host
    rather than trusting its public half: a name that points inside the network
    at all is not one to fetch from."""
    try:
        infos = socket.getaddrinfo(hostname, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise CIMDError(f"could not resolve client_id host: {exc}") from exc
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if not address_allowed(address):
            raise CIMDError(f"client_id host resolves to a non-public address ({address})")
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise CIMDError("client_id host did not resolve to any address")
    return addresses
