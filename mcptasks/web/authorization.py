"""The resource-server half of MCP authorization (2026-07-28 ``basic/authorization``),
on the HTTP request.

mcptasks does not issue tokens: an authorization server does (on the example
site, django-oauth-toolkit). What the MCP endpoint does, in both protocol eras
and on the ASGI fast path alike, is:

* answer a caller it cannot identify with 401 and a challenge,
  ``WWW-Authenticate: Bearer resource_metadata="…", scope="…"``, that leads a
  client to the RFC 9728 protected resource metadata and from there to the
  authorization server;
* refuse (401) a token that was not issued for this resource (RFC 8707
  audience), as well as garbage, expired and revoked tokens;
* refuse (403 ``insufficient_scope``) a token without ``MCPTASKS["SCOPES"]``,
  and hand the handlers a caller that carries its token's scopes, which they
  check against each tool's (``mcptasks.protocol.authorization``).

Identification stays with the DRF authentication classes in
``MCPTASKS["AUTHENTICATION_CLASSES"]``. This module reads what they return:
a token object with ``scope`` and ``resource`` (django-oauth-toolkit's
``AccessToken``), or a mapping of claims with ``scope`` and ``aud`` (a JWT).
Credentials without scopes (static tokens, sessions) are not limited by
scopes, and this module never imports django-oauth-toolkit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.http import HttpRequest

from ..conf import settings
from ..protocol.authorization import InsufficientScope, challenge, endpoint_path, expand, has_scopes, metadata_url
from ..protocol.caller import Caller
from .identity import NotAuthenticated, identify

_DEFAULT_PORTS = {"http": 80, "https": 443}


def enabled() -> bool:
    """Whether the endpoint acts as an OAuth resource server (``AUTHORIZATION_SERVERS`` set)."""
    return settings.AUTHORIZATION_SERVERS is not None


# URLs -----------------------------------------------------------------------------------


def resource_url(request: HttpRequest, path: str | None = None) -> str:
    """The canonical URL of the MCP endpoint (``resource`` in RFC 8707 and RFC 9728)."""
    if settings.RESOURCE_URL:
        return settings.RESOURCE_URL
    return request.build_absolute_uri(path if path is not None else request.path)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def authorization_servers(request: HttpRequest, resource: str | None = None) -> list[str]:
    """The issuers, with path entries ("/") resolved against the resource's origin."""
    origin = _origin(resource or resource_url(request, endpoint_path()))
    servers = []
    for entry in settings.AUTHORIZATION_SERVERS or ():
        servers.append(origin + entry.rstrip("/") if entry.startswith("/") else entry)
    return servers


def _canonical(url: Any) -> tuple[str, str, int | None, str] | None:
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname or parts.username is not None or parts.fragment:
        return None
    scheme = parts.scheme.lower()
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS.get(scheme), parts.path.rstrip("/")


def audience_matches(audiences: Iterable[Any], resource: str) -> bool:
    """Whether a token for ``audiences`` may be used on ``resource``: one of
    them is the resource itself or a parent of it (same origin, path prefix on
    a segment boundary), as RFC 8707 resource indicators are compared."""
    target = _canonical(resource)
    if target is None:
        return False
    for audience in audiences:
        found = _canonical(audience)
        if found is None or found[:3] != target[:3]:
            continue
        if target[3] == found[3] or target[3].startswith(found[3] + "/"):
            return True
    return False


# Tokens -----------------------------------------------------------------------------------


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, (list, tuple, set, frozenset)):
        return [str(item) for item in value]
    return []


def token_scopes(auth: Any) -> frozenset[str] | None:
    """The scopes a credential grants, or ``None`` for one that has none."""
    if auth is None:
        return None
    scope = auth.get("scope") if isinstance(auth, Mapping) else getattr(auth, "scope", None)
    if scope is None:
        return None
    return expand(_as_list(scope))


def token_audiences(auth: Any) -> list[str] | None:
    """The resources a token was issued for; ``None`` for credentials that
    carry no audience at all (static tokens, sessions)."""
    if auth is None:
        return None
    if isinstance(auth, Mapping):
        if "aud" in auth:
            return _as_list(auth["aud"])
        return [] if "scope" in auth else None
    resource = getattr(auth, "resource", None)
    if resource is None:
        return None
    return _as_list(resource)


# The request --------------------------------------------------------------------------------


def _bearer_sent(request: HttpRequest) -> bool:
    return request.headers.get("Authorization", "").split(" ", 1)[0].lower() == "bearer"


def authenticate(request: HttpRequest) -> Caller:
    """The caller of an MCP request with its scopes, or ``NotAuthenticated``
    carrying the right status and challenge."""
    if not enabled():
        caller = identify(request)
        if not caller.authenticated and _bearer_sent(request):
            # An authentication class that ignores tokens it cannot verify
            # (django-oauth-toolkit's) must not make a bad token anonymous.
            raise NotAuthenticated("Invalid token.", "Bearer")
        scopes = token_scopes(caller.auth) if caller.authenticated else None
        return caller if scopes is None else replace(caller, scopes=scopes)

    resource = resource_url(request)
    metadata = metadata_url(resource)
    baseline = list(settings.SCOPES)

    def refuse(message: str, error: str | None) -> NotAuthenticated:
        return NotAuthenticated(message, challenge(metadata, baseline, error, message if error else None))

    bearer = _bearer_sent(request)
    try:
        caller = identify(request)
    except NotAuthenticated as exc:
        raise refuse(
            "The access token is invalid, expired or revoked." if bearer else exc.message,
            "invalid_token" if bearer else None,
        ) from None
    if not caller.authenticated:
        if bearer:
            raise refuse("The access token is invalid, expired or revoked.", "invalid_token")
        return replace(caller, resource_metadata=metadata)
    audiences = token_audiences(caller.auth)
    if audiences is not None and not audience_matches(audiences, resource):
        raise refuse("The access token was not issued for this resource.", "invalid_token")
    caller = replace(caller, scopes=token_scopes(caller.auth), resource_metadata=metadata)
    if not has_scopes(caller, baseline):
        insufficient = InsufficientScope(baseline, metadata)
        raise NotAuthenticated(insufficient.message, insufficient.headers["WWW-Authenticate"], status=403)
    return caller
