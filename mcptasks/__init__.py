"""mcptasks: serve MCP tools from a Django site, with slow tools as durable tasks.

Everything a site writes in its own code comes from here: the decorators
(``tool``, ``prompt``, ``resource``, ``resource_template``) and the tool
registry, the ``ToolContext`` a tool or prompt takes, the questions it may ask,
the helpers that build its result, the errors it may raise (with their
JSON-RPC codes), the beat schedule for the settings, and the ASGI router.
Importing the package loads no models and reads no settings, so a settings
module may import from it; ``mcp_router`` alone is loaded on first use, from an
``asgi.py`` after Django is set up.

Besides it, sites name dotted paths in their settings and URLconf
(``mcptasks.urls``, ``mcptasks.web.identity``, ``mcptasks.oauth``), read
settings through ``mcptasks.conf.settings``, test their tools with
``mcptasks.testing`` and call servers with ``mcptasks.client``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MissingCapability,
    ProtocolError,
    SoftTimeLimitExceeded,
    TaskCancelled,
    ToolError,
)
from .tools.context import ToolContext, elicitation, roots, sampling
from .tools.registry import prompt, registry, resource, resource_template, tool
from .tools.results import ToolResult, audio, image, text
from .worker.beat import BEAT_SCHEDULE

if TYPE_CHECKING:
    from .web.asgi import mcp_router

__all__ = [
    "BEAT_SCHEDULE",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "MissingCapability",
    "ProtocolError",
    "SoftTimeLimitExceeded",
    "TaskCancelled",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "audio",
    "elicitation",
    "image",
    "mcp_router",
    "prompt",
    "registry",
    "resource",
    "resource_template",
    "roots",
    "sampling",
    "text",
    "tool",
]

#: Names loaded on first use: their modules need Django set up.
_LAZY = {"mcp_router": "mcptasks.web.asgi"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mcptasks' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
