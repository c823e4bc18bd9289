"""mcptasks: serve MCP tools from a Django site, with slow tools as durable tasks."""

from .context import ToolContext, elicitation, roots, sampling
from .errors import ProtocolError, ToolError
from .registry import tool
from .results import ToolResult, audio, image, text

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
