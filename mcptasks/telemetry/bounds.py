"""The one home for bounding what callers put into telemetry.

Every span name, attribute and metric label built from caller input goes
through here, so a stranger cannot grow what the site exports: a value from a
closed set (an MCP method, a registered tool or prompt) is kept when it is in
the set and recorded as :data:`OTHER` otherwise (the OpenTelemetry HTTP
conventions' ``_OTHER``), so the series are fixed by the site's own tools;
anything else (ids, a session, a queue name) is cut to a fixed length with
its control characters replaced. docs/observability.md states the bounds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

#: What a value outside its closed set is recorded as.
OTHER = "_OTHER"
#: Ids (``jsonrpc.request.id``, ``mcptasks.task.id``, ``mcp.session.id``) keep this many characters.
MAX_ID_CHARS = 128
#: Any other text taken from a caller keeps this many characters.
MAX_TEXT_CHARS = 256

#: The methods of both protocol eras (2025-11-25 and 2026-07-28 with the tasks extension).
MCP_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "subscriptions/listen",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "logging/setLevel",
        "tasks/get",
        "tasks/update",
        "tasks/cancel",
        "tasks/list",
        "tasks/result",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
        "notifications/roots/list_changed",
        "notifications/elicitation/complete",
        "notifications/tasks",
        "notifications/tasks/status",
    }
)

TOOL = "tool"
PROMPT = "prompt"

#: Who knows each closed set of names (the tool registry tells us: telemetry sits below it).
_known: dict[str, Callable[[str], bool]] = {}

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_PROTOCOL_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")


def recognise(kind: str, is_known: Callable[[str], bool]) -> None:
    """Name the test of which names of ``kind`` (:data:`TOOL`, :data:`PROMPT`) the site has."""
    _known[kind] = is_known


def method(value: Any) -> str:
    """An MCP method, or :data:`OTHER`."""
    return value if isinstance(value, str) and value in MCP_METHODS else OTHER


def name(kind: str, value: Any) -> str:
    """A name the site registered (a tool, a prompt), or :data:`OTHER`."""
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        return OTHER
    is_known = _known.get(kind)
    return value if is_known is not None and is_known(value) else OTHER


def tool(value: Any) -> str:
    return name(TOOL, value)


def prompt(value: Any) -> str:
    return name(PROMPT, value)


def one_of(value: Any, allowed: Collection[str]) -> str:
    """``value`` if it is one of ``allowed`` (an outcome, a status), or :data:`OTHER`."""
    return value if isinstance(value, str) and value in allowed else OTHER


def text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """Caller text as an attribute: at most ``limit`` characters, control
    characters and lone surrogates replaced (a log line or exporter stays whole)."""
    cut = str(value)[:limit]
    return _UNPRINTABLE.sub("\ufffd", cut)


def identifier(value: Any) -> str:
    """An id from a caller: at most :data:`MAX_ID_CHARS` characters."""
    return text(value, MAX_ID_CHARS)


def protocol_version(value: Any) -> str:
    """A protocol version is a date (``YYYY-MM-DD``): anything else is :data:`OTHER`."""
    if isinstance(value, str) and _PROTOCOL_VERSION.fullmatch(value.strip()):
        return value.strip()
    return OTHER
