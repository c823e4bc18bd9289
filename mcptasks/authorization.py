"""The resource-server half of MCP authorization (2026-07-28 ``basic/authorization``).

mcptasks does not issue tokens: an authorization server does (on the example
site, django-oauth-toolkit). What the MCP endpoint does, in both protocol eras
and on the ASGI fast path alike, is:

* answer a caller it cannot identify with 401 and a challenge,
  ``WWW-Authenticate: Bearer resource_metadata="…", scope="…"``, that leads a
  client to the RFC 9728 protected resource metadata and from there to the
  authorization server;
* refuse (401) a token that was not issued for this resource (RFC 8707
  audience), as well as garbage, expired and revoked tokens;
* check scopes: ``MCPTASKS["SCOPES"]`` on every request, and a tool's own
  ``@tool(scopes=[...])`` on ``tools/call`` and on every task request about
  that tool's tasks, answering 403 ``insufficient_scope`` with the full scope
  needed so that a client can step up.

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

from django.core.checks import CheckMessage, Error, Warning, register
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from .conf import settings
from .errors import INVALID_REQUEST, ProtocolError
from .identity import Caller, NotAuthenticated, identify

WELL_KNOWN = "/.well-known/oauth-protected-resource"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def enabled() -> bool:
    """Whether the endpoint acts as an OAuth resource server (``AUTHORIZATION_SERVERS`` set)."""
    return settings.AUTHORIZATION_SERVERS is not None


# URLs -----------------------------------------------------------------------------------


def endpoint_path() -> str:
    """The MCP endpoint's path: from ``RESOURCE_URL``, else its URL route."""
    if settings.RESOURCE_URL:
        return urlsplit(settings.RESOURCE_URL).path or "/"
    try:
        return reverse("mcptasks:endpoint")
    except NoReverseMatch:
        return "/mcp"


def resource_url(request: HttpRequest, path: str | None = None) -> str:
    """The canonical URL of the MCP endpoint (``resource`` in RFC 8707 and RFC 9728)."""
    if settings.RESOURCE_URL:
        return settings.RESOURCE_URL
    return request.build_absolute_uri(path if path is not None else request.path)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def metadata_url(resource: str) -> str:
    """Where the resource's RFC 9728 metadata lives: the well-known prefix
    inserted between the origin and the resource's path (the path form)."""
    parts = urlsplit(resource)
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN + parts.path.rstrip("/"), "", ""))


def authorization_servers(request: HttpRequest, resource: str | None = None) -> list[str]:
    """The issuers, with path entries ("/") resolved against the resource's origin."""
    origin = _origin(resource or resource_url(request, endpoint_path()))
    servers = []
    for entry in settings.AUTHORIZATION_SERVERS or ():
        servers.append(origin + entry.rstrip("/") if entry.startswith("/") else entry)
    return servers


def scopes_supported() -> list[str]:
    """The scopes a client may need here: the baseline and every tool's."""
    from .registry import registry

    found = dict.fromkeys(settings.SCOPES)
    for tool in registry.all():
        found.update(dict.fromkeys(tool.scopes))
    return list(found)


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


def expand(scopes: Iterable[str]) -> frozenset[str]:
    """``scopes`` with everything they grant through ``SCOPE_HIERARCHY``."""
    hierarchy = settings.SCOPE_HIERARCHY
    granted: set[str] = set()
    pending = list(scopes)
    while pending:
        scope = pending.pop()
        if scope not in granted:
            granted.add(scope)
            pending.extend(hierarchy.get(scope, ()))
    return frozenset(granted)


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


# Challenges -------------------------------------------------------------------------------


def _quoted(value: str) -> str:
    cleaned = value.replace("\r", "").replace("\n", "")
    return '"' + cleaned.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(
    resource_metadata: str | None,
    scopes: Iterable[str] = (),
    error: str | None = None,
    description: str | None = None,
) -> str:
    """A ``WWW-Authenticate`` Bearer challenge (RFC 6750 with RFC 9728's ``resource_metadata``)."""
    params: list[tuple[str, str]] = []
    if error:
        params.append(("error", error))
        if description:
            params.append(("error_description", description))
    if resource_metadata:
        params.append(("resource_metadata", resource_metadata))
    scope = " ".join(dict.fromkeys(scopes))
    if scope:
        params.append(("scope", scope))
    if not params:
        return "Bearer"
    return "Bearer " + ", ".join(f"{name}={_quoted(value)}" for name, value in params)


class InsufficientScope(ProtocolError):
    """403: the caller's token lacks a scope the operation needs."""

    def __init__(self, needed: list[str], resource_metadata: str | None) -> None:
        scope = " ".join(needed)
        super().__init__(INVALID_REQUEST, f"Forbidden: this needs the scope '{scope}'", http_status=403)
        self.needed = needed
        self.headers = {
            "WWW-Authenticate": challenge(
                resource_metadata, needed, "insufficient_scope", f"This request needs the scope '{scope}'."
            )
        }


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
        exc = InsufficientScope(baseline, metadata)
        raise NotAuthenticated(exc.message, exc.headers["WWW-Authenticate"], status=403)
    return caller


# Scope checks -------------------------------------------------------------------------------


def has_scopes(caller: Caller, needed: Iterable[str]) -> bool:
    return caller.scopes is None or set(needed) <= caller.scopes


def scopes_for_tool(tool: Any) -> list[str]:
    """Everything a call of ``tool`` needs: the baseline and the tool's own."""
    return list(dict.fromkeys([*settings.SCOPES, *(getattr(tool, "scopes", ()) or ())]))


def require_tool(caller: Caller, tool: Any) -> None:
    """``InsufficientScope`` unless the caller may use ``tool`` (tools/call)."""
    needed = scopes_for_tool(tool)
    if not has_scopes(caller, needed):
        raise InsufficientScope(needed, caller.resource_metadata)


def require_task(caller: Caller, task: Any) -> None:
    """``InsufficientScope`` unless the caller may use the tool that ``task``
    runs: checked after the ownership check, so another owner's task is
    still just "not found"."""
    if caller.scopes is None:
        return
    from .registry import registry

    require_tool(caller, registry.get(task.tool_name))


def denied_tools(caller: Caller) -> list[str]:
    """Names of the tools the caller's scopes do not reach (for listings)."""
    if caller.scopes is None:
        return []
    from .registry import registry

    return [tool.name for tool in registry.all() if not has_scopes(caller, scopes_for_tool(tool))]


# System checks ------------------------------------------------------------------------------


def _http_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.fragment


def _routed(path: str) -> bool:
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        return False
    return True


@register("mcptasks")
def check_authorization(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Half-configured resource servers (ids E020-E021, W020-W022; see docs/authorization.md)."""
    try:
        servers = settings.AUTHORIZATION_SERVERS
        resource = settings.RESOURCE_URL
    except (TypeError, ValueError):
        return []  # mcptasks.E000 reports an invalid MCPTASKS
    found: list[CheckMessage] = []
    if servers is not None:
        bad = [s for s in servers if not (isinstance(s, str) and (s.startswith("/") or _http_url(s)))]
        if not servers or bad:
            found.append(
                Error(
                    "MCPTASKS['AUTHORIZATION_SERVERS'] must list issuer URLs (or '/' for this site): "
                    + (f"{bad!r} are not" if bad else "it is empty, so no client could find where to sign in"),
                    hint="Set it to None to turn the OAuth resource server off.",
                    id="mcptasks.E020",
                )
            )
    if resource is not None and not _http_url(resource):
        found.append(
            Error(
                f"MCPTASKS['RESOURCE_URL'] must be the endpoint's absolute http(s) URL, not {resource!r}.",
                id="mcptasks.E021",
            )
        )
    # Only the site's own baseline: tools' scopes (possibly from a third-party
    # app) only narrow OAuth tokens and are harmless on a site without them.
    if servers is None and settings.SCOPES:
        found.append(
            Warning(
                "MCPTASKS['SCOPES'] is set but MCPTASKS['AUTHORIZATION_SERVERS'] is not: "
                "clients are refused without being told where to get a token with those scopes.",
                id="mcptasks.W020",
            )
        )
    if servers:
        path = endpoint_path().rstrip("/")
        if not _routed(WELL_KNOWN + path):
            found.append(
                Warning(
                    f"No protected resource metadata is served at {WELL_KNOWN + path}: "
                    "clients cannot discover the authorization server.",
                    hint='Add path("", include("mcptasks.oauth.urls")) to the root URLconf.',
                    id="mcptasks.W021",
                )
            )
        for entry in servers:
            if isinstance(entry, str) and entry.startswith("/"):
                metadata = "/.well-known/oauth-authorization-server" + entry.rstrip("/")
                if not _routed(metadata):
                    found.append(
                        Warning(
                            f"AUTHORIZATION_SERVERS names {entry!r} on this site, but nothing serves {metadata}.",
                            hint="Mount django-oauth-toolkit's metadata_urlpatterns at the root.",
                            id="mcptasks.W022",
                        )
                    )
    return found
