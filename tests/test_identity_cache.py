"""The in-process identity cache that polls on the event loop read."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mcptasks.protocol.caller import Caller
from mcptasks.web import identity_cache

SCOPE: dict[str, Any] = {"scheme": "http", "root_path": "", "server": ("testserver", 80), "query_string": b""}
HEADERS = {"authorization": "Bearer abc", "host": "testserver"}


@pytest.fixture(autouse=True)
def fresh(settings) -> None:
    settings.MCPTASKS = {
        **settings.MCPTASKS,
        "IDENTITY_CACHE_SECONDS": 5.0,
        "AUTHENTICATION_CLASSES": ["mcptasks.web.identity.BearerTokenAuthentication"],
    }
    identity_cache.clear()


def caller(auth: Any = None) -> Caller:
    return Caller(owner="user:1", auth=auth, authenticated=True)


def test_a_caller_is_remembered_until_the_setting_s_seconds(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "IDENTITY_CACHE_SECONDS": 0.2}
    key = identity_cache.request_key(HEADERS, SCOPE)
    assert key is not None
    identity_cache.remember(key, caller())
    assert identity_cache.lookup(key) == caller()
    time.sleep(0.25)
    assert identity_cache.lookup(key) is None


def test_never_past_the_token_s_own_expiry():
    key = identity_cache.request_key(HEADERS, SCOPE)
    identity_cache.remember(key, caller({"scope": "mcp", "exp": time.time() - 1}))
    assert identity_cache.lookup(key) is None
    identity_cache.remember(key, caller({"scope": "mcp", "exp": time.time() + 0.2}))
    assert identity_cache.lookup(key) is not None
    time.sleep(0.25)
    assert identity_cache.lookup(key) is None


def test_the_key_covers_credentials_host_and_query():
    base = identity_cache.request_key(HEADERS, SCOPE)
    assert identity_cache.request_key({**HEADERS, "authorization": "Bearer abd"}, SCOPE) != base
    assert identity_cache.request_key({**HEADERS, "host": "elsewhere"}, SCOPE) != base
    assert identity_cache.request_key(HEADERS, {**SCOPE, "query_string": b"access_token=x"}) != base
    assert identity_cache.request_key(HEADERS, {**SCOPE, "scheme": "https"}) != base
    assert identity_cache.request_key(dict(HEADERS), dict(SCOPE)) == base


def test_cookies_and_unknown_classes_are_never_cached(settings):
    assert identity_cache.request_key({**HEADERS, "cookie": "sessionid=x"}, SCOPE) is None
    settings.MCPTASKS = {
        **settings.MCPTASKS,
        "AUTHENTICATION_CLASSES": ["rest_framework.authentication.RemoteUserAuthentication"],
    }
    assert identity_cache.request_key(HEADERS, SCOPE) is None


def test_off_when_the_setting_is_zero(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "IDENTITY_CACHE_SECONDS": 0}
    assert identity_cache.request_key(HEADERS, SCOPE) is None


def test_bounded_and_cleared_on_setting_changes(settings, monkeypatch):
    monkeypatch.setattr(identity_cache, "MAX_ENTRIES", 3)
    for n in range(5):
        identity_cache.remember(f"k{n}", caller())
    assert [identity_cache.lookup(f"k{n}") is not None for n in range(5)] == [False, False, True, True, True]
    settings.ALLOWED_HOSTS = ["example.org"]
    assert identity_cache.lookup("k4") is None
