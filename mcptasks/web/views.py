"""The MCP endpoint: one URL, both protocol eras.

This module is HTTP only: it checks the request, parses the envelope,
identifies the caller and hands the message to the wire adapter for its era.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase
from django.http.request import validate_host
from django.views.decorators.csrf import csrf_exempt

from ..conf import settings
from ..errors import INVALID_REQUEST, InvalidParams, ProtocolError
from ..protocol import jsonrpc, request_limits
from ..protocol.caller import Caller
from ..protocol.legacy import handlers as legacy
from ..protocol.modern import handlers as modern
from ..protocol.modern.headers import META_VERSION
from ..protocol.replies import WireReply, empty_reply, error_reply, failsafe, message_reply, result_reply
from ..protocol.streaming import Deferred
from ..telemetry import requests as request_telemetry
from ..threads import tool_threads, worker_threads
from . import identity_cache
from .authorization import authenticate
from .hangup import cancelled_by_hangup, outliving
from .identity import NotAuthenticated
from .rendering import render

_LOOPBACK = {"localhost", "127.0.0.1", "[::1]", "::1"}


def error_response(exc: ProtocolError, request_id: Any = None, status: int = 400) -> HttpResponseBase:
    return render(error_reply(exc, request_id, status))


def origin_allowed(origin: str) -> bool:
    """DNS-rebinding guard: a browser ``Origin`` must name this site."""
    allowed = settings.ALLOWED_ORIGINS
    if allowed is not None:
        return origin in allowed
    try:
        host = urlsplit(origin).hostname
    except ValueError:  # e.g. "http://[" : not an origin at all
        return False
    if not host:
        return False
    if host in _LOOPBACK:
        return True
    hosts = list(django_settings.ALLOWED_HOSTS)
    if django_settings.DEBUG and not hosts:
        hosts = [".localhost", "127.0.0.1", "[::1]"]
    return validate_host(host, hosts)


def lowercase_headers(request: HttpRequest) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}


def is_legacy(request: HttpRequest, data: Any) -> bool:
    """Era selection. A legacy ``MCP-Protocol-Version`` header, or no header
    and no modern ``_meta`` in the body (an ``initialize``, say), selects the
    2025-era session wire; anything else is served statelessly (2026-07-28)."""
    return legacy_wire(request.headers.get("MCP-Protocol-Version"), data)


def legacy_wire(header: str | None, data: Any) -> bool:
    """:func:`is_legacy` from the ``MCP-Protocol-Version`` header's value and the body."""
    if header is not None:
        return header.strip() in legacy.LEGACY_VERSIONS
    params = data.get("params") if isinstance(data, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return not (isinstance(meta, dict) and META_VERSION in meta)


def authenticated_caller(request: HttpRequest, request_id: Any = None) -> Caller | WireReply:
    """The caller, or the reply that refuses it (401, 403); fills the identity
    cache for requests served through ASGI."""
    try:
        caller = authenticate(request)  # identify, then the OAuth resource-server checks
    except NotAuthenticated as exc:
        headers = {"WWW-Authenticate": exc.www_authenticate} if exc.www_authenticate else {}
        return message_reply(
            jsonrpc.error(request_id, ProtocolError(INVALID_REQUEST, exc.message)), status=exc.status, headers=headers
        )
    scope = getattr(request, "scope", None)  # served through ASGI: polls on the loop may reuse it
    if scope is not None:
        key = identity_cache.request_key(lowercase_headers(request), scope)
        if key is not None:
            identity_cache.remember(key, caller)
    return caller


def read_body(request: HttpRequest) -> bytes:
    """The request body, refused (413) past ``MAX_BODY_BYTES`` before it is read
    whole when the client announced its length."""
    limit = settings.MAX_BODY_BYTES
    if limit is not None:
        try:
            announced = int(request.headers.get("Content-Length") or 0)
        except ValueError:
            raise ProtocolError(INVALID_REQUEST, "Invalid Content-Length header") from None
        if announced > limit:
            raise request_limits.RequestTooLarge(limit)
    try:
        body = request.body
    except RequestDataTooBig:
        raise request_limits.RequestTooLarge(limit or django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE) from None
    if limit is not None and len(body) > limit:
        raise request_limits.RequestTooLarge(limit)
    return body


@csrf_exempt
async def mcp_endpoint(request: HttpRequest) -> HttpResponseBase:
    """The MCP endpoint (async: streams hold no thread; the rest runs on a
    fixed pool of worker threads)."""
    try:
        request.get_host()  # ALLOWED_HOSTS: the DNS-rebinding guard on Host
    except DisallowedHost:
        return error_response(ProtocolError(INVALID_REQUEST, "Bad Request: invalid Host header"), status=400)
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin):
        return error_response(ProtocolError(INVALID_REQUEST, "Forbidden: invalid Origin header"), status=403)
    if request.method in ("GET", "DELETE") and request.headers.get(legacy.SESSION_HEADER):
        return await sync_to_async(_serve_session_request, thread_sensitive=False, executor=worker_threads())(request)
    if request.method != "POST":
        return render(
            message_reply(
                jsonrpc.error(None, ProtocolError(INVALID_REQUEST, f"Method {request.method} not allowed")),
                status=405,
                headers={"Allow": "POST"},
            )
        )
    try:
        data = jsonrpc.decode(read_body(request))
        request_limits.check_depth(data)
    except ProtocolError as exc:
        return error_response(exc, status=exc.http_status or 400)
    traced = request_telemetry.open_request(data, request.headers)
    try:
        # A hang-up cancels this coroutine (see ``hangup``): the inline run is told.
        served = await outliving(
            sync_to_async(_serve_post, thread_sensitive=False, executor=worker_threads())(request, data), _abandon
        )
        while isinstance(served, PendingReply):  # a deferred reply may defer again
            pending = served
            finish = sync_to_async(_finish, thread_sensitive=False, executor=tool_threads())(pending)
            served = await cancelled_by_hangup(finish, pending.deferred.abandon)
        return served
    finally:
        request_telemetry.close_request(traced)


def _abandon(served: HttpResponseBase | PendingReply) -> None:
    if isinstance(served, PendingReply):
        served.deferred.abandon()


class PendingReply:
    """A modern reply whose blocking part (``Deferred``) is still to run."""

    def __init__(self, deferred: Deferred, message: jsonrpc.Message) -> None:
        self.deferred = deferred
        self.message = message


def _request_id(args: tuple[Any, ...]) -> Any:
    """The JSON-RPC id among a handler's arguments, when it has a valid one."""
    for arg in args:
        if isinstance(arg, PendingReply):
            return arg.message.id
        if isinstance(arg, dict):
            value = arg.get("id")
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                return value
    return None


@overload
def _on_our_threads(serve: Callable[..., WireReply]) -> Callable[..., HttpResponseBase]: ...
@overload
def _on_our_threads(
    serve: Callable[..., WireReply | PendingReply],
) -> Callable[..., HttpResponseBase | PendingReply]: ...
def _on_our_threads(serve: Callable[..., WireReply | PendingReply]) -> Callable[..., HttpResponseBase | PendingReply]:
    """Work on our own threads: Django's per-request connection upkeep, the
    one error path of both eras (``failsafe``), and the reply rendered as HTTP
    there rather than on the event loop."""

    def wrapper(*args: Any) -> HttpResponseBase | PendingReply:
        def served() -> WireReply | PendingReply:
            close_old_connections()
            try:
                return serve(*args)
            finally:
                close_old_connections()

        reply = failsafe(served, _request_id(args))
        if isinstance(reply, PendingReply):
            return reply
        request_telemetry.note_reply(reply.body, reply.status)
        return render(reply)

    return wrapper


@_on_our_threads
def _serve_session_request(request: HttpRequest) -> WireReply:
    caller = authenticated_caller(request)
    if isinstance(caller, WireReply):
        return caller
    return legacy.handle_session_request(request.method or "GET", request.headers.get(legacy.SESSION_HEADER), caller)


@_on_our_threads
def _serve_post(request: HttpRequest, data: Any) -> WireReply | PendingReply:
    if is_legacy(request, data):
        caller = authenticated_caller(request, data.get("id") if isinstance(data, dict) else None)
        if isinstance(caller, WireReply):
            return caller
        return legacy.handle_post(request.headers.get(legacy.SESSION_HEADER), data, caller)
    try:
        message = jsonrpc.parse_message(data)
    except InvalidParams as exc:  # a sound envelope whose params are not: its id is known
        return error_reply(exc, _request_id((data,)))
    except ProtocolError as exc:
        return error_reply(exc)
    caller = authenticated_caller(request, message.id)
    if isinstance(caller, WireReply):
        return caller
    if message.is_notification:
        return empty_reply(202)
    return _answer(message, lambda: modern.handle(message, caller, lowercase_headers(request)))


@_on_our_threads
def _finish(pending: PendingReply) -> WireReply | PendingReply:
    return _answer(pending.message, pending.deferred.compute)


def _answer(message: jsonrpc.Message, compute: Callable[[], Any]) -> WireReply | PendingReply:
    """Run a 2026-07-28 handler: its reply, or its protocol error with the
    HTTP status that era gives it (outages and bugs: ``failsafe``)."""
    try:
        reply = compute()
    except ProtocolError as exc:
        return error_reply(exc, message.id, status=modern.http_status(exc))
    if isinstance(reply, Deferred):
        return PendingReply(reply, message)
    return result_reply(message.id, reply)
