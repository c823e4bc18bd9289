"""HTTP for what the handlers of both eras answer: a ``WireReply`` becomes a
JSON response, an SSE response, or an empty one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse

from ..protocol.jsonrpc import encode_json
from ..protocol.replies import WireReply
from ..protocol.streaming import SSE_HEADERS


def json_response(
    body: dict[str, Any] | None, status: int = 200, headers: Mapping[str, str] | None = None
) -> HttpResponse:
    if body is None:
        response = HttpResponse(status=status)
    else:
        response = HttpResponse(encode_json(body), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def render(reply: WireReply) -> HttpResponseBase:
    if reply.stream is None:
        return json_response(reply.body, status=reply.status, headers=reply.headers)
    response = StreamingHttpResponse(reply.stream.encoded(), status=reply.status, content_type="text/event-stream")
    for name, value in {**SSE_HEADERS, **reply.headers}.items():
        response[name] = value
    return response
