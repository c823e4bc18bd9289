"""The client_id URL rules and the address rules of a metadata document fetch
(mcptasks.oauth.cimd_rules), without a network."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from oauth2_provider.cimd import CIMDError

from mcptasks.oauth import cimd_rules


@pytest.mark.parametrize(
    "url",
    [
        "https://client.example/client.json",
        "https://client.example:8443/clients/a?v=2",
        "HTTPS://Client.Example/c",
        "https://[2001:db8::1]/c",
    ],
)
def test_a_client_id_url_within_the_rules_is_parsed(url):
    parsed = cimd_rules.client_id_url(url)
    assert parsed.hostname and parsed.path


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://client.example/client.json", "https"),
        ("ftp://client.example/client.json", "https"),
        ("https:///client.json", "host"),
        ("https://client.example:99999/client.json", "port"),
        ("https://client.example:port/client.json", "port"),
        ("https://user:pass@client.example/client.json", "userinfo"),
        ("https://user@client.example/client.json", "userinfo"),
        ("https://@client.example/client.json", "userinfo"),
        ("https://client.example/client.json#me", "fragment"),
        ("https://client.example/client.json#", "fragment"),
        ("https://client.example", "path"),
        ("https://client.example?x=1", "path"),
        ("https://client.example/a/./client.json", "dot"),
        ("https://client.example/a/../client.json", "dot"),
        ("https://client.example/..", "dot"),
        ("https://client.example/a/.", "dot"),
    ],
)
def test_a_client_id_url_breaking_a_rule_is_refused(url, rule):
    with pytest.raises(CIMDError, match=rule):
        cimd_rules.client_id_url(url)


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"],
)
def test_a_globally_routable_address_is_public(address):
    assert cimd_rules.address_public(address)


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.1",  # private
        "172.16.5.4",
        "192.168.1.1",
        "127.0.0.1",  # loopback
        "::1",
        "169.254.169.254",  # link-local: cloud metadata
        "fe80::1",
        "fe80::1%1",
        "100.64.0.1",  # shared address space (CGNAT)
        "240.0.0.1",  # reserved
        "224.0.0.1",  # multicast
        "ff02::1",
        "0.0.0.0",  # unspecified
        "::",
        "fc00::1",  # unique local
        "::ffff:127.0.0.1",  # IPv4-mapped forms of internal addresses
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "not an address",
    ],
)
def test_an_address_that_is_not_globally_routable_is_refused(address):
    assert not cimd_rules.address_public(address)


def test_an_ipv4_mapped_public_address_is_judged_by_its_ipv4():
    assert cimd_rules.address_public("::ffff:8.8.8.8") == cimd_rules.address_public("8.8.8.8")


def resolving_to(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_host_with_only_public_addresses_resolves(monkeypatch):
    resolving_to(monkeypatch, "93.184.216.34", "2606:4700:4700::1111", "93.184.216.34")
    assert cimd_rules.resolve_public("client.example", 443) == ["93.184.216.34", "2606:4700:4700::1111"]


@pytest.mark.parametrize("private", ["10.0.0.7", "127.0.0.1", "::ffff:192.168.0.1", "169.254.169.254"])
def test_one_internal_address_refuses_the_whole_host(monkeypatch, private):
    resolving_to(monkeypatch, "93.184.216.34", private)
    with pytest.raises(CIMDError, match="non-public"):
        cimd_rules.resolve_public("split.example", 443)
    resolving_to(monkeypatch, private, "93.184.216.34")
    with pytest.raises(CIMDError, match="non-public"):
        cimd_rules.resolve_public("split.example", 443)


def test_a_host_that_does_not_resolve_is_refused(monkeypatch):
    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror("no such host")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(CIMDError, match="could not resolve"):
        cimd_rules.resolve_public("nowhere.example", 443)
    resolving_to(monkeypatch)
    with pytest.raises(CIMDError, match="any address"):
        cimd_rules.resolve_public("empty.example", 443)


def test_loopback_is_refused_unless_the_predicate_is_widened(monkeypatch):
    resolving_to(monkeypatch, "127.0.0.1")
    with pytest.raises(CIMDError):
        cimd_rules.resolve_public("localhost", 443)
    monkeypatch.setattr(cimd_rules, "address_allowed", lambda address: address == "127.0.0.1")
    assert cimd_rules.resolve_public("localhost", 443) == ["127.0.0.1"]


def test_the_fetcher_refuses_a_bad_url_and_an_internal_host_before_connecting(settings, monkeypatch):
    from mcptasks.oauth.cimd import MCPClientMetadataFetcher

    def no_connection(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("connected")

    monkeypatch.setattr(socket, "create_connection", no_connection)
    with pytest.raises(CIMDError, match="https"):
        MCPClientMetadataFetcher().fetch("http://client.example/client.json")
    resolving_to(monkeypatch, "93.184.216.34", "10.1.2.3")
    with pytest.raises(CIMDError, match="non-public"):
        MCPClientMetadataFetcher().fetch("https://split.example/client.json")


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b:1::a00:1",  # RFC 8215's local-use NAT64 prefix: the site's own IPv4 network
        "64:ff9b:1:ffff::808:808",  # the same prefix, whatever it embeds
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254 (cloud metadata)
        "::a00:1",  # IPv4-compatible 10.0.0.1
        "::ffff:a9fe:a9fe",  # IPv4-mapped 169.254.169.254
        "::ffff:7f00:1",  # IPv4-mapped 127.0.0.1
    ],
)
def test_nat64_local_use_and_ipv4_compatible_forms_of_private_ranges_are_refused(address):
    assert not cimd_rules.address_public(address)


def test_an_ipv4_compatible_public_address_is_judged_by_its_ipv4():
    assert cimd_rules.address_public("::808:808") == cimd_rules.address_public("8.8.8.8")
