"""mcptasks: serve MCP tools from a Django site, with slow tools as durable tasks.

The author API lives here: the decorators (``tool``, ``prompt``, ``resource``,
``resource_template``), the ``ToolContext`` a tool or prompt takes, the
questions it may ask and the helpers that build its result. Importing it loads
no models and reads no settings, so a settings module may import from the
package.
"""

from .errors import ProtocolError, SoftTimeLimitExceeded, ToolError
from .tools.context import ToolContext, elicitation, roots, sampling
from .tools.registry import prompt, resource, resource_template, tool
from .tools.results import ToolResult, audio, image, text

__all__ = [
    "ProtocolError",
    "SoftTimeLimitExceeded",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "audio",
    "elicitation",
    "image",
    "prompt",
    "resource",
    "resource_template",
    "roots",
    "sampling",
    "text",
    "tool",
]
