"""The public path of the ASGI router (``from mcptasks.asgi import mcp_router``);
the code lives in ``mcptasks.web.asgi``. A package rather than a module file, so
that the file's history follows the code to ``web/``."""

from ..web.asgi import MCPHandler, mcp_router

__all__ = ["MCPHandler", "mcp_router"]
