"""JSON-RPC 2.0 envelope: parsing requests and building responses."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import INVALID_REQUEST, PARSE_ERROR, InvalidParams, ProtocolError

RequestId = str | int


@dataclass
class Message:
    """One parsed client message: a request (``id`` set) or a notification."""

    method: str
    params: dict[str, Any]
    id: RequestId | None = None
    is_notification: bool = False
    raw: dict[str, Any] = field(default_factory=dict)


def encode_json(body: Any) -> bytes:
    """Compact one-line UTF-8 JSON; a lone surrogate the client sent (legal
    JSON syntax, no Unicode meaning) is echoed as its escape, not a crash."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


def result(request_id: RequestId | None, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: RequestId | None, exc: ProtocolError) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "error": exc.to_dict()}
    if request_id is not None:
        body["id"] = request_id
    return body


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class _PastDoubleRange(dict[str, Any]):
    """A decoded message holding a number past double range (``1e400``):
    valid JSON, but no store can keep it, so :func:`parse_message` refuses it."""


def decode(raw: bytes) -> Any:
    past_range = False

    def parse_float(text: str) -> float:
        nonlocal past_range
        value = float(text)
        if not math.isfinite(value):
            past_range = True
        return value

    try:
        data = json.loads(raw, parse_constant=_not_json, parse_float=parse_float)
    except RecursionError:
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(PARSE_ERROR, "Parse error: the body is not valid JSON") from None
    return _PastDoubleRange(data) if past_range and isinstance(data, dict) else data


def non_finite_path(value: Any, path: str = "") -> str | None:
    """Where in ``value`` a number past double range sits (``arguments.x.0``), if anywhere."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return at
        if isinstance(node, dict):
            stack.extend((child, f"{at}.{key}" if at else str(key)) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, f"{at}.{i}" if at else str(i)) for i, child in enumerate(node))
    return None


def parse_message(data: Any) -> Message:
    """Validate the envelope of one message (not its params' contents)."""
    if isinstance(data, list):
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: batches are not supported")
    if not isinstance(data, dict):
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: expected a JSON object")
    if data.get("jsonrpc") != "2.0":
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    if "method" not in data:
        if "result" in data or "error" in data:
            raise ProtocolError(INVALID_REQUEST, "Invalid Request: clients must not send responses")
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "method" is required')
    method = data["method"]
    if not isinstance(method, str) or not method:
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string')
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "params" must be an object')
    if isinstance(data, _PastDoubleRange):
        where = non_finite_path(params) or "params"
        raise InvalidParams(f'"{where[:100]}" holds a number past double range (a JSON number must be finite)')
    if "id" not in data:
        return Message(method=method, params=params, is_notification=True, raw=data)
    request_id = data["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer')
    return Message(method=method, params=params, id=request_id, raw=data)
