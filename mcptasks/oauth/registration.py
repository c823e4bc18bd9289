"""Dynamic client registration (RFC 7591) for MCP clients.

An MCP client registers itself the first time it meets a server, before any
user has signed in, so the toolkit's default permission (an authenticated
caller) would turn every one of them away. Opening registration to anyone is
safe only for what such a client needs, so this permission admits exactly that:

* the authorization code grant (with refresh tokens), nothing else: no client
  credentials, no password grant, no device flow;
* redirect URIs that are ``https`` or ``http`` on a loopback address (a
  native client's local callback, RFC 8252);
* a bounded number of registrations per client address and hour
  (``MCPTASKS_REGISTRATIONS_PER_HOUR`` in the Django settings, default 30).

A registered client still gets no token without a signed-in user approving
it on the consent page, and PKCE is required. :func:`metadata_allowed` is the
one statement of these rules: it also holds a client's later updates
(:mod:`mcptasks.oauth.client_configuration`) and the documents of clients that
identify themselves by URL (:mod:`mcptasks.oauth.cimd`).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.core.cache import cache
from django.http import HttpRequest

ALLOWED_GRANT_TYPES = {"authorization_code", "refresh_token"}
LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


def redirect_uri_allowed(uri: Any) -> bool:
    if not isinstance(uri, str):
        return False
    try:
        parts = urlsplit(uri)
    except ValueError:
        return False
    if parts.fragment or not parts.hostname:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS)


def metadata_allowed(data: Any) -> bool:
    """Whether registration metadata asks only for what an MCP client needs."""
    if not isinstance(data, dict):
        return True  # not metadata at all: the registration view answers the error
    grant_types = data.get("grant_types", ["authorization_code"])
    if not isinstance(grant_types, list) or not all(isinstance(grant, str) for grant in grant_types):
        return False
    if not set(grant_types) <= ALLOWED_GRANT_TYPES:
        return False
    redirect_uris = data.get("redirect_uris", [])
    return isinstance(redirect_uris, list) and bool(redirect_uris) and all(map(redirect_uri_allowed, redirect_uris))


class MCPClientRegistrationPermission:
    """``DCR_REGISTRATION_PERMISSION_CLASSES`` entry: open registration for
    public MCP clients, limited as the module docstring says."""

    def has_permission(self, request: HttpRequest) -> bool:
        try:
            data = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError):
            return True  # malformed: the registration view answers invalid_client_metadata
        if request.method == "POST" and not metadata_allowed(data):
            return False
        return self._within_rate(request) if request.method == "POST" else True

    def _within_rate(self, request: HttpRequest) -> bool:
        limit = getattr(django_settings, "MCPTASKS_REGISTRATIONS_PER_HOUR", 30)
        if not limit:
            return True
        key = f"mcptasks:dcr:{request.META.get('REMOTE_ADDR', '')}"
        cache.add(key, 0, timeout=3600)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=3600)
            count = 1
        return count <= limit
