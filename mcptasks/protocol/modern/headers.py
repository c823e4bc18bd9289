"""Versions and headers of the 2026-07-28 wire: the version and capabilities
every request carries in ``params._meta``, and the ``Mcp-*`` headers that must
mirror the body."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from ...conf import settings
from ...errors import (
    HEADER_MISMATCH,
    TASKS_EXTENSION,
    UNSUPPORTED_VERSION,
    InvalidParams,
    ProtocolError,
)
from ...tools.context import LOG_LEVELS
from ...tools.registry import Tool
from ..jsonrpc import Message

PROTOCOL_VERSION = "2026-07-28"
MODERN_VERSIONS = (PROTOCOL_VERSION,)

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"

TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")


class HeaderMismatch(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(HEADER_MISMATCH, f"Header mismatch: {message}")


def supported_versions() -> list[str]:
    return list(MODERN_VERSIONS)


def server_info() -> dict[str, str]:
    return {"name": settings.SERVER_NAME, "version": settings.SERVER_VERSION}


# Header validation -------------------------------------------------------------------

_B64_PREFIX, _B64_SUFFIX = "=?base64?", "?="


def decode_header_value(value: str) -> str:
    """Undo the ``=?base64?...?=`` sentinel encoding of ``Mcp-Name`` and
    ``Mcp-Param-*`` values."""
    if value.startswith(_B64_PREFIX) and value.endswith(_B64_SUFFIX) and len(value) >= len(_B64_PREFIX) + 2:
        encoded = value[len(_B64_PREFIX) : -len(_B64_SUFFIX)]
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise HeaderMismatch("a header value is not valid base64-encoded UTF-8") from None
    return value


_NAME_SOURCE = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def _check_mirrored(header_name: str, raw: str | None, body_value: Any, *, required: bool) -> None:
    if raw is None:
        if required:
            raise HeaderMismatch(f"the {header_name} header is required")
        return
    value = decode_header_value(raw.strip())
    if value != body_value:
        raise HeaderMismatch(f"{header_name} header value '{value}' does not match body value '{body_value}'")


def validate_headers(message: Message, headers: Mapping[str, str]) -> None:
    """``Mcp-Method`` and ``Mcp-Name`` must mirror the body (-32020 otherwise)."""
    _check_mirrored("Mcp-Method", headers.get("mcp-method"), message.method, required=True)
    source = _NAME_SOURCE.get(message.method)
    if source is not None:
        _check_mirrored("Mcp-Name", headers.get("mcp-name"), message.params.get(source), required=True)
    elif message.method in TASK_METHODS:
        # Some clients omit Mcp-Name on tasks/*: tolerate absence, reject a wrong one.
        _check_mirrored("Mcp-Name", headers.get("mcp-name"), message.params.get("taskId"), required=False)


_HEADER_SAFE = re.compile(r"^[\x20-\x7e\t]*$")


def _header_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_param_headers(tool: Tool, arguments: Mapping[str, Any], headers: Mapping[str, str]) -> None:
    """Each ``x-mcp-header`` parameter present in the body must be mirrored,
    equal, in its ``Mcp-Param-{Name}`` header (-32020 otherwise)."""
    for suffix, path in tool.header_params:
        value: Any = arguments
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        raw = headers.get(f"mcp-param-{suffix.lower()}")
        if raw is not None and not _HEADER_SAFE.match(raw):
            raise HeaderMismatch(f"Mcp-Param-{suffix} contains invalid characters")
        if value is None:
            continue
        if raw is None:
            raise HeaderMismatch(f"the Mcp-Param-{suffix} header is required when '{'.'.join(path)}' is sent")
        decoded = decode_header_value(raw.strip())
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                matches = float(decoded) == value  # compared as numbers: "42.0" matches 42
            except ValueError:
                matches = False
        else:
            matches = decoded == _header_text(value)
        if not matches:
            raise HeaderMismatch(f"Mcp-Param-{suffix} header value '{decoded}' does not match body value '{value}'")


def check_version(message: Message, headers: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """The request's protocol version and capabilities, validated in the
    order the spec's errors imply: missing ``_meta`` fields (-32602, HTTP
    400), then header against body (-32020), then support (-32022)."""
    meta = message.params.get("_meta")
    if not isinstance(meta, dict):
        meta = {}
    missing = [key for key in (META_VERSION, META_CAPABILITIES) if key not in meta]
    if missing:
        raise InvalidParams(f"Invalid params: missing required _meta field(s): {', '.join(missing)}", http_status=400)
    version, capabilities = meta[META_VERSION], meta[META_CAPABILITIES]
    if not isinstance(version, str):
        raise InvalidParams(f"Invalid params: _meta {META_VERSION} must be a string", http_status=400)
    if not isinstance(capabilities, dict):
        raise InvalidParams(f"Invalid params: _meta {META_CAPABILITIES} must be an object", http_status=400)
    if META_LOG_LEVEL in meta and meta[META_LOG_LEVEL] not in LOG_LEVELS:
        raise InvalidParams(
            f"Invalid params: _meta {META_LOG_LEVEL} must be one of {', '.join(LOG_LEVELS)}", http_status=400
        )
    header = headers.get("mcp-protocol-version")
    if header is None:
        raise HeaderMismatch("the MCP-Protocol-Version header is required")
    if header.strip() != version:
        raise HeaderMismatch(
            f"MCP-Protocol-Version header value '{header.strip()}' does not match body value '{version}'"
        )
    if version not in MODERN_VERSIONS:
        raise ProtocolError(
            UNSUPPORTED_VERSION,
            "Unsupported protocol version",
            {"supported": supported_versions(), "requested": version},
        )
    return version, capabilities


def has_tasks_extension(capabilities: Mapping[str, Any]) -> bool:
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)
