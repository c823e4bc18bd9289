"""The public path of the ASGI router (``from mcptasks.asgi import mcp_router``);
the code lives in ``mcptasks.web.asgi``."""

from .web.asgi import MCPHandler, mcp_router

__all__ = ["MCPHandler", "mcp_router"]
