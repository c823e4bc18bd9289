"""Serving the MCP endpoint straight from ASGI.

Django's ASGI handler runs every synchronous middleware through its own
sync-to-async hop (a thread round trip each, per request); on a poll that is
most of the cost. The endpoint needs none of that middleware: it identifies
callers with DRF authentication from headers, checks ``Host`` and ``Origin``
itself, and keeps its own threads' database connections. So ``/mcp`` can be
routed here and everything else to Django::

    application = mcp_router(get_asgi_application(), path="/mcp")

Sites that want their middleware around the endpoint can keep using
``mcptasks.urls`` instead; both serve the same view.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.urls import set_script_prefix

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class MCPHandler(ASGIHandler):
    """Django's request and response plumbing around the MCP view only."""

    def load_middleware(self, is_async: bool = False) -> None:
        """No middleware on this path (see the module docstring)."""

    async def _refuse_oversized(self, scope: Scope, send: Send) -> bool:
        """413 at once for an announced length over ``MAX_BODY_BYTES``: the
        body is never read."""
        from ..conf import settings

        limit = settings.MAX_BODY_BYTES
        if limit is None:
            return False
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    return False  # the view answers a malformed length
                if announced > limit:
                    await self.send_response(_too_large_response(), send)
                    return True
        return False

    async def read_body(self, receive: Receive) -> Any:
        """The body, but never more than ``MAX_BODY_BYTES`` of it (a chunked
        body that grows past the limit is refused while it arrives)."""
        from ..conf import settings

        limit = settings.MAX_BODY_BYTES
        body = tempfile.SpooledTemporaryFile(max_size=1024 * 1024, mode="w+b")  # noqa: SIM115 (handed to the request)
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body.close()
                raise RequestAborted()
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit is not None and size > limit:
                body.close()
                raise _BodyTooLarge()
            body.write(chunk)
            if not message.get("more_body", False):
                break
        body.seek(0)
        return body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from .views import mcp_endpoint

        if scope["type"] != "http":
            raise ValueError(f"MCPHandler serves HTTP, not {scope['type']!r}")
        too_large = await self._refuse_oversized(scope, send)
        if too_large:
            return
        try:
            body = await self.read_body(receive)
        except RequestAborted:
            return
        except _BodyTooLarge:
            await self.send_response(_too_large_response(), send)
            return
        set_script_prefix(scope.get("root_path", "") or "/")
        request, error = self.create_request(scope, body)
        if request is None:
            body.close()
            await self.send_response(error, send)
            return

        try:
            response = await mcp_endpoint(request)
            if not response.streaming:
                # A plain reply is complete: nothing is left for a disconnect
                # to stop, so it needs no watcher (the polling hot path).
                await self.send_response(response, send)
                return
            # A stream runs until the client goes away: that ends it.
            work = asyncio.ensure_future(self.send_response(response, send))
            disconnect = asyncio.ensure_future(self.listen_for_disconnect(receive))
            try:
                await asyncio.wait({work, disconnect}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (disconnect, work):
                    if not task.done():
                        task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                        await task
        finally:
            body.close()


class _BodyTooLarge(Exception):
    pass


def _too_large_response() -> Any:
    from ..conf import settings
    from ..protocol.limits import RequestTooLarge
    from .views import error_response

    return error_response(RequestTooLarge(settings.MAX_BODY_BYTES or 0), status=413)


def mcp_router(django_app: ASGIApp, *, path: str = "/mcp") -> ASGIApp:
    """An ASGI app that serves ``path`` with :class:`MCPHandler` and hands
    every other request to ``django_app``."""
    handler = MCPHandler()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == path:
            await handler(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return app
