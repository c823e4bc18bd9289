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
import io
import logging
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpResponseBase
from django.http.request import split_domain_port, validate_host
from django.urls import set_script_prefix

if TYPE_CHECKING:
    from ..protocol.caller import Caller
    from ..protocol.jsonrpc import Message
    from ..protocol.replies import WireReply

logger = logging.getLogger("mcptasks.views")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
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

    async def read_body(self, receive: Receive) -> IO[bytes]:
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
        if scope.get("method") == "POST":
            # Either the loop serves the request, and answers it whatever
            # happens, or it leaves it untouched to the thread path: a
            # request is never served twice.
            served = await _serve_on_loop(scope, body.read())
            if served is not None:
                body.close()
                await self.send_response(served, send)
                return
            body.seek(0)
        set_script_prefix(scope.get("root_path", "") or "/")
        request, error = self.create_request(scope, body)
        if request is None:
            body.close()
            assert error is not None  # Django's answer when it makes no request
            await self.send_response(error, send)
            return

        try:
            await self._serve_until_hangup(request, receive, send)
        finally:
            body.close()

    async def _serve_until_hangup(self, request: Any, receive: Receive, send: Send) -> None:
        """Serve the request while listening for the client going away, as
        Django's own handler does: a hang-up cancels the view, whose inline
        run is then cancelled (``hangup``), or ends the stream; nothing more is
        sent. (Polls served on the loop above need no watcher: they hold no
        work a hang-up could stop.)"""
        from .views import mcp_endpoint

        async def respond() -> None:
            await self.send_response(await mcp_endpoint(request), send)

        work = asyncio.ensure_future(respond())
        disconnect = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({work, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (disconnect, work):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await task


async def _serve_on_loop(scope: Scope, body: bytes) -> HttpResponseBase | None:
    """The response to a modern request that the event loop's pipeline
    serves (``on_loop.takes``: a task tool's creation, ``tasks/get``,
    ``tasks/update``, ``tasks/cancel``), or ``None`` for a request the thread
    path serves from the start (:func:`_taken_by_loop`, decided before
    anything is read or written). A request the loop takes is answered here,
    errors included (``replies.failsafe``'s answers), once."""
    try:
        taken = _taken_by_loop(scope, body)
    except Exception:  # nothing is done yet: the thread path serves it, and answers whatever this was
        logger.warning("the event loop could not decide on a request; the thread path serves it", exc_info=True)
        return None
    if taken is None:
        return None
    return await _answer_on_loop(scope, body, *taken)


def _taken_by_loop(scope: Scope, body: bytes) -> tuple[Any, Message, Caller | None, dict[str, str]] | None:
    """The request, its message, its caller (``None`` when the identity
    cache does not know it yet) and headers if the loop takes it; ``None``
    for one the thread path serves: one it would refuse before the handler
    (Host, Origin, body, envelope), one whose caller may never come from the
    identity cache (``identity_cache.request_key``), and whatever
    ``on_loop.takes`` leaves to it. So every refusal keeps its one home, in
    ``views``."""
    from ..errors import ProtocolError
    from ..protocol import jsonrpc, limits
    from ..protocol.modern import on_loop
    from . import identity_cache
    from .views import legacy_wire, origin_allowed

    if not any(method in body for method in _LOOP_METHODS) or not on_loop.available():
        return None  # other requests are parsed once, on the thread path
    headers = _scope_headers(scope)
    if not _host_allowed(headers.get("host")):
        return None
    origin = headers.get("origin")
    if origin is not None and not origin_allowed(origin):
        return None
    upload_limit = django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if upload_limit is not None and len(body) > upload_limit:
        return None
    try:
        int(headers.get("content-length") or 0)
        data = jsonrpc.decode(body)
        limits.check_depth(data)
        if legacy_wire(headers.get("mcp-protocol-version"), data):
            return None
        message = jsonrpc.parse_message(data)
    except (ProtocolError, ValueError):
        return None  # the thread path refuses it
    if message.is_notification or not on_loop.takes(message, headers):
        return None
    key = identity_cache.request_key(headers, scope)
    if key is None:
        return None  # a caller that must not come from the cache (cookies, other authentication): a thread's
    return data, message, identity_cache.lookup(key), headers


async def _answer_on_loop(
    scope: Scope, body: bytes, data: Any, message: Message, caller: Caller | None, headers: Mapping[str, str]
) -> HttpResponseBase:
    """Serve a request the loop took, and answer it: its result, its
    protocol error, a refusal of its credentials, or (an outage, a bug) the
    one error path's answer. A caller the identity cache does not know is
    identified on a thread, at that step (DRF's authenticators are
    synchronous), which fills the cache."""
    from ..errors import ProtocolError
    from ..protocol.modern import handlers as modern
    from ..protocol.modern import on_loop
    from ..protocol.replies import WireReply, error_reply, result_reply, unexpected_error_reply
    from ..telemetry import requests as request_telemetry
    from .rendering import render

    started = request_telemetry.now_ns()
    # A creation stores the request's trace context on its row, so its span
    # is current while it runs; other requests report once answered.
    opened = request_telemetry.open_request(data, headers) if message.method == "tools/call" else None
    try:
        try:
            identified = caller if caller is not None else await _identify(scope, body, message.id)
            if isinstance(identified, WireReply):
                reply = identified  # refused: 401 or 403, with its challenge
            else:
                reply = result_reply(message.id, await on_loop.serve(message, identified, headers))
        except ProtocolError as exc:
            reply = error_reply(exc, message.id, status=modern.http_status(exc))
        except Exception as exc:  # answered once, as on a thread: never served again
            reply = unexpected_error_reply(exc, message.id)
        if opened is None:
            request_telemetry.served_on_loop(data, headers, started, reply.body, reply.status)
        else:
            request_telemetry.note_reply(reply.body, reply.status)
    finally:
        request_telemetry.close_request(opened)
    return render(reply)


async def _identify(scope: Scope, body: bytes, request_id: Any) -> Caller | WireReply:
    """``views.authenticated_caller`` on one of the endpoint's threads, for
    a Django request made from the scope (no middleware runs on this route)."""
    from ..threads import on_a_thread
    from .views import authenticated_caller

    request = ASGIRequest(scope, io.BytesIO(body))
    return await on_a_thread(lambda: authenticated_caller(request, request_id))


#: The methods of ``on_loop.METHODS``, as they appear in a body.
_LOOP_METHODS = (b"tools/call", b"tasks/get", b"tasks/update", b"tasks/cancel")


def _scope_headers(scope: Scope) -> dict[str, str]:
    """The request's headers as ``views.lowercase_headers`` gives them from
    Django's request (names lower case, ``_`` as ``-``, repeats joined)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin1").lower().replace("_", "-")
        value = raw_value.decode("latin1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def _host_allowed(host: str | None) -> bool:
    """``HttpRequest.get_host``'s check, for a plain ``Host`` header only (a
    forwarded host is left to Django)."""
    if host is None or django_settings.USE_X_FORWARDED_HOST:
        return False
    allowed = django_settings.ALLOWED_HOSTS
    if django_settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


class _BodyTooLarge(Exception):
    pass


def _too_large_response() -> HttpResponseBase:
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
