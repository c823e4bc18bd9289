"""Building a ``CallToolResult`` from what a tool returns."""

from __future__ import annotations

import base64
import json
from typing import Any


class ToolResult:
    """A complete ``CallToolResult`` built by the tool itself."""

    def __init__(
        self,
        content: list[dict[str, Any]] | None = None,
        *,
        structured: Any = None,
        is_error: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.content = content or []
        self.structured = structured
        self.is_error = is_error
        self.meta = meta

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"content": self.content, "isError": self.is_error}
        if self.structured is not None:
            data["structuredContent"] = self.structured
        if self.meta:
            data["_meta"] = self.meta
        return data


def is_tool_error(result: Any) -> bool:
    """Whether a ``CallToolResult`` is the tool's own error (``isError``)."""
    return isinstance(result, dict) and result.get("isError") is True


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def image(data: bytes | str, mime_type: str = "image/png") -> dict[str, Any]:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode("ascii")
    return {"type": "image", "data": encoded, "mimeType": mime_type}


def audio(data: bytes | str, mime_type: str = "audio/wav") -> dict[str, Any]:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode("ascii")
    return {"type": "audio", "data": encoded, "mimeType": mime_type}


_CONTENT_TYPES = {"text", "image", "audio", "resource", "resource_link"}


def to_call_result(value: Any) -> dict[str, Any]:
    """Turn what a tool returned into a ``CallToolResult`` (without ``resultType``).

    ``str`` becomes one text block; a ``dict`` becomes ``structuredContent``
    plus its JSON as text; a content block or a list of them is used as is.
    """
    if isinstance(value, ToolResult):
        return value.to_dict()
    if value is None:
        return {"content": [], "isError": False}
    if isinstance(value, str):
        return {"content": [text(value)], "isError": False}
    if isinstance(value, dict) and value.get("type") in _CONTENT_TYPES:
        return {"content": [value], "isError": False}
    if isinstance(value, list) and all(isinstance(v, dict) and v.get("type") in _CONTENT_TYPES for v in value):
        return {"content": list(value), "isError": False}
    return {
        "content": [text(json.dumps(value, separators=(",", ":"), default=str))],
        "structuredContent": value,
        "isError": False,
    }


def error_result(message: str, content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"content": content or [text(message)], "isError": True}
