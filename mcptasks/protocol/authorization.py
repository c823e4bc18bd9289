"""Scopes, the rules of MCP authorization that the protocol handlers apply.

``MCPTASKS["SCOPES"]`` is needed on every request, and a tool's own
``@tool(scopes=[...])`` on ``tools/call`` and on every task request about
that tool's tasks; a token that lacks one gets 403 ``insufficient_scope``
with the full scope needed, so that a client can step up. Credentials
without scopes (static tokens, sessions, anonymous callers) are not limited
by scopes.

The HTTP side (who the caller is, the 401 challenge, the token's audience)
is ``mcptasks.web.authorization``; the Bearer challenge's format and the
metadata location are here because a 403 from a handler carries them too,
and the system checks (below ``web``) need the latter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.urls import NoReverseMatch, reverse

from ..conf import settings
from ..errors import INVALID_REQUEST, ProtocolError
from ..tools.registry import registry
from .caller import Caller

WELL_KNOWN = "/.well-known/oauth-protected-resource"


# Where the resource is described ------------------------------------------------------------


def endpoint_path() -> str:
    """The MCP endpoint's path: from ``RESOURCE_URL``, else its URL route."""
    if settings.RESOURCE_URL:
        return urlsplit(settings.RESOURCE_URL).path or "/"
    try:
        return reverse("mcptasks:endpoint")
    except NoReverseMatch:
        return "/mcp"


def metadata_url(resource: str) -> str:
    """Where the resource's RFC 9728 metadata lives: the well-known prefix
    inserted between the origin and the resource's path (the path form)."""
    parts = urlsplit(resource)
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN + parts.path.rstrip("/"), "", ""))


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


# Scopes -------------------------------------------------------------------------------------


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


def scopes_supported() -> list[str]:
    """The scopes a client may need here: the baseline and every tool's."""
    found = dict.fromkeys(settings.SCOPES)
    for tool in registry.all():
        found.update(dict.fromkeys(tool.scopes))
    return list(found)


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
    require_tool(caller, registry.get(task.tool_name))


def denied_tools(caller: Caller) -> list[str]:
    """Names of the tools the caller's scopes do not reach (for listings)."""
    if caller.scopes is None:
        return []
    return [tool.name for tool in registry.all() if not has_scopes(caller, scopes_for_tool(tool))]
