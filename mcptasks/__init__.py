"""mcptasks: serve MCP tools from a Django site, with slow tools as durable tasks."""

from .errors import ProtocolError, ToolError
from .tools.context import ToolContext, elicitation, roots, sampling
from .tools.registry import tool
from .tools.results import ToolResult, audio, image, text

__all__ = [
    "ProtocolError",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "audio",
    "elicitation",
    "image",
    "roots",
    "sampling",
    "text",
    "tool",
]
