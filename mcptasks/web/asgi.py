"""``/mcp`` straight from ASGI (``mcp_router``), without Django's middleware (a thread round trip each; the
endpoint checks ``Host`` and ``Origin`` and identifies callers itself). A task tool's plain creation and the
task methods are served on the event loop, decided before anything is done; the rest by ``views`` on a thread."""

from __future__ import annotations

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

from ..conf import settings
from ..errors import ProtocolError
from ..protocol import jsonrpc, limits
from ..threads import on_a_thread
from . import identity_cache
from .hangup import until_hangup

if TYPE_CHECKING:
    from ..protocol.caller import Caller
    from ..protocol.jsonrpc import Message

logger = logging.getLogger("mcptasks.views")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class MCPHandler(ASGIHandler):
    """Django's request and response plumbing around the MCP view only."""

    def load_middleware(self, is_async: bool = False) -> None:
        """No middleware on this path."""

    async def read_body(self, receive: Receive) -> IO[bytes]:
        """The body, refused while it arrives once past ``MAX_BODY_BYTES``."""
        limit = settings.MAX_BODY_BYTES
        body = tempfile.SpooledTemporaryFile(max_size=1024 * 1024, mode="w+b")  # noqa: SIM115 (handed to the request)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body.close()
                raise RequestAborted()
            chunk = message.get("body", b"")
            if limit is not None and body.tell() + len(chunk) > limit:
                body.close()
                raise limits.RequestTooLarge(limit)
            body.write(chunk)
            if not message.get("more_body", False):
                break
        body.seek(0)
        return body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"MCPHandler serves HTTP, not {scope['type']!r}")
        try:
            _refuse_announced_length(scope)
            body = await self.read_body(receive)
        except RequestAborted:
            return
        except limits.RequestTooLarge as exc:
            from .views import error_response

            await self.send_response(error_response(exc, status=413), send)
            return
        try:
            # The loop serves a request, and answers it whatever happens, or
            # leaves it untouched to the thread path: never served twice.
            response = await _serve_on_loop(scope, body.read()) if scope.get("method") == "POST" else None
            if response is None:
                body.seek(0)
                set_script_prefix(scope.get("root_path", "") or "/")
                request, response = self.create_request(scope, body)  # Django's answer when it makes no request
                if request is not None:
                    await until_hangup(self._respond(request, send), self.listen_for_disconnect(receive))
                    return
            assert response is not None
            await self.send_response(response, send)
        finally:
            body.close()

    async def _respond(self, request: Any, send: Send) -> None:
        from .views import mcp_endpoint

        await self.send_response(await mcp_endpoint(request), send)


def _refuse_announced_length(scope: Scope) -> None:
    """``RequestTooLarge`` for a ``Content-Length`` over ``MAX_BODY_BYTES``, before the body is read."""
    limit = settings.MAX_BODY_BYTES
    for name, value in scope.get("headers", []):
        if name == b"content-length" and limit is not None:
            try:
                announced = int(value)
            except ValueError:
                return  # the view answers a malformed length
            if announced > limit:
                raise limits.RequestTooLarge(limit)


#: ``handlers.LOOP_METHODS``, as they appear in a body.
_LOOP_METHODS = (b"tools/call", b"tasks/get", b"tasks/update", b"tasks/cancel")


async def _serve_on_loop(scope: Scope, body: bytes) -> HttpResponseBase | None:
    """The response to a request the loop takes (:func:`_taken_by_loop`), errors included, or ``None`` for one
    the thread path serves from the start. A caller the identity cache does not know is identified on a thread."""
    from ..protocol.modern import handlers as modern
    from ..protocol.replies import WireReply, error_reply, result_reply, unexpected_error_reply
    from ..telemetry import requests as request_telemetry
    from .rendering import render
    from .views import authenticated_caller

    try:
        taken = _taken_by_loop(scope, body)
    except Exception:  # nothing is done yet: the thread path serves it, and answers whatever this was
        logger.warning("the event loop could not decide on a request; the thread path serves it", exc_info=True)
        return None
    if taken is None:
        return None
    data, message, caller, headers = taken
    started = request_telemetry.now_ns()
    # A creation stores the request's trace context on its row, so its span
    # is current while it runs; other requests report once answered.
    opened = request_telemetry.open_request(data, headers) if message.method == "tools/call" else None
    try:
        try:
            identified: Caller | WireReply | None = caller
            if identified is None:  # DRF's authenticators are synchronous; this fills the cache
                request = ASGIRequest(scope, io.BytesIO(body))
                identified = await on_a_thread(lambda: authenticated_caller(request, message.id))
            if isinstance(identified, WireReply):
                reply = identified  # refused: 401 or 403, with its challenge
            else:
                reply = result_reply(message.id, await modern.serve_on_loop(message, identified, headers))
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


def _taken_by_loop(scope: Scope, body: bytes) -> tuple[Any, Message, Caller | None, dict[str, str]] | None:
    """The request's data, message, cached caller (``None`` if unknown) and headers if the
    loop takes it; ``None`` leaves it to the thread path, which keeps every refusal (Host,
    Origin, body, envelope) and the callers the identity cache may not give."""
    from ..protocol.modern import handlers as modern
    from .views import legacy_wire, origin_allowed

    if not any(method in body for method in _LOOP_METHODS) or not limits.poll_throttle_on_loop():
        return None  # other requests are parsed once, on the thread path
    headers: dict[str, str] = {}  # as ``views.lowercase_headers`` gives them
    for raw_name, raw_value in scope.get("headers", []):
        name, value = raw_name.decode("latin1").lower().replace("_", "-"), raw_value.decode("latin1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    host, origin = headers.get("host"), headers.get("origin")
    if host is None or django_settings.USE_X_FORWARDED_HOST:
        return None  # a forwarded host is Django's to check
    allowed = django_settings.ALLOWED_HOSTS or ([".localhost", "127.0.0.1", "[::1]"] if django_settings.DEBUG else [])
    domain, _port = split_domain_port(host)
    if not (domain and validate_host(domain, allowed)) or (origin is not None and not origin_allowed(origin)):
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
    if message.is_notification or not modern.takes_on_loop(message, headers):
        return None
    key = identity_cache.request_key(headers, scope)
    if key is None:
        return None  # a caller that must not come from the cache (cookies, other authentication): a thread's
    return data, message, identity_cache.lookup(key), headers


def mcp_router(django_app: ASGIApp, *, path: str = "/mcp") -> ASGIApp:
    """An ASGI app: ``path`` served by :class:`MCPHandler`, every other request by ``django_app``."""
    handler = MCPHandler()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == path:
            await handler(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return app
