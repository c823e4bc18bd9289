"""The plain JSON response that both eras and the endpoint send."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from .jsonrpc import encode_json


def json_response(
    body: dict[str, Any] | None, status: int = 200, headers: dict[str, str] | None = None
) -> HttpResponse:
    if body is None:
        response = HttpResponse(status=status)
    else:
        response = HttpResponse(encode_json(body), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response
