"""The 2025-era session wire (``initialize``, ``Mcp-Session-Id``, the
experimental tasks of 2025-11-25), on the same durable engine."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from ..errors import INVALID_REQUEST, ProtocolError
from ..identity import Caller
from . import jsonrpc

LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")


def _unsupported(request_id: Any = None) -> HttpResponse:
    from ..views import json_response

    exc = ProtocolError(
        INVALID_REQUEST,
        "This server speaks MCP 2026-07-28 (send io.modelcontextprotocol/protocolVersion in params._meta)",
        {"supported": ["2026-07-28"]},
    )
    return json_response(jsonrpc.error(request_id, exc), status=400)


def handle_post(request: HttpRequest, data: Any, caller: Caller) -> HttpResponse:
    return _unsupported(data.get("id") if isinstance(data, dict) else None)


def handle_session_request(request: HttpRequest, caller: Caller) -> HttpResponse:
    return _unsupported()
