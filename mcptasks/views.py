"""The MCP endpoint: one URL, both protocol eras.

This module is HTTP only: it checks the request, parses the envelope,
identifies the caller and hands the message to the wire adapter for its era.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.request import validate_host
from django.views.decorators.csrf import csrf_exempt

from .conf import settings
from .errors import INTERNAL_ERROR, INVALID_REQUEST, ProtocolError
from .identity import NotAuthenticated, identify
from .wire import jsonrpc, modern
from .wire.streaming import SSE_HEADERS, Stream

logger = logging.getLogger("mcptasks.views")

_LOOPBACK = {"localhost", "127.0.0.1", "[::1]", "::1"}


def json_response(
    body: dict[str, Any] | None, status: int = 200, headers: dict[str, str] | None = None
) -> HttpResponse:
    if body is None:
        response = HttpResponse(status=status)
    else:
        response = HttpResponse(
            json.dumps(body, separators=(",", ":"), ensure_ascii=False),
            status=status,
            content_type="application/json",
        )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def error_response(exc: ProtocolError, request_id: Any = None, status: int = 400) -> HttpResponse:
    return json_response(jsonrpc.error(request_id, exc), status=status)


def origin_allowed(origin: str) -> bool:
    """DNS-rebinding guard: a browser ``Origin`` must name this site."""
    allowed = settings.ALLOWED_ORIGINS
    if allowed is not None:
        return origin in allowed
    host = urlsplit(origin).hostname
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


@csrf_exempt
def mcp_endpoint(request: HttpRequest) -> HttpResponse:
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin):
        return error_response(ProtocolError(INVALID_REQUEST, "Forbidden: invalid Origin header"), status=403)
    if request.method != "POST":
        return json_response(
            jsonrpc.error(None, ProtocolError(INVALID_REQUEST, f"Method {request.method} not allowed")),
            status=405,
            headers={"Allow": "POST"},
        )
    try:
        message = jsonrpc.parse_message(jsonrpc.decode(request.body))
    except ProtocolError as exc:
        return error_response(exc)

    try:
        caller = identify(request)
    except NotAuthenticated as exc:
        headers = {"WWW-Authenticate": exc.www_authenticate} if exc.www_authenticate else {}
        return json_response(
            jsonrpc.error(message.id, ProtocolError(INVALID_REQUEST, exc.message)), status=401, headers=headers
        )

    if message.is_notification:
        return HttpResponse(status=202)

    try:
        reply = modern.handle(message, caller, lowercase_headers(request))
    except ProtocolError as exc:
        return error_response(exc, message.id, status=modern.http_status(exc))
    except DatabaseError:
        logger.exception("database error serving %s", message.method)
        exc = ProtocolError(INTERNAL_ERROR, "Internal error: the task store is unavailable; retry later")
        return error_response(exc, message.id, status=503)
    except Exception:
        logger.exception("unexpected error serving %s", message.method)
        return error_response(ProtocolError(INTERNAL_ERROR, "Internal error"), message.id, status=500)
    if isinstance(reply, Stream):
        response = StreamingHttpResponse(reply.encoded(), content_type="text/event-stream")
        for name, value in SSE_HEADERS.items():
            response[name] = value
        return response
    return json_response(jsonrpc.result(message.id, reply))
