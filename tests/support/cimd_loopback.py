"""Lets the authorization server fetch client metadata documents from
loopback, for the tests that serve documents there (tests/support/cimd_server.py).

The fetch refuses every non-public address, loopback included; a test relaxes
that for loopback alone: in-process with :func:`allow_loopback` (monkeypatch),
in a live stack by running it on ``tests.support.cimd_loopback_settings``,
which installs this module's app. Both replace the one address check that
django-oauth-toolkit's resolution and mcptasks' fetcher share.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from django.apps import AppConfig


def allow_loopback(public: Callable[[str], bool]) -> Callable[[str], bool]:
    def public_or_loopback(ip: str) -> bool:
        return ipaddress.ip_address(ip).is_loopback or public(ip)

    return public_or_loopback


class LoopbackDocumentsConfig(AppConfig):
    name = "tests.support.cimd_loopback"
    label = "tests_cimd_loopback"

    def ready(self) -> None:
        from oauth2_provider import cimd

        cimd._ip_is_public = allow_loopback(cimd._ip_is_public)
