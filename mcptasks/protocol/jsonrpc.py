"""JSON-RPC 2.0 envelope: parsing requests and building responses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import INVALID_REQUEST, PARSE_ERROR, ProtocolError

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


def decode(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(PARSE_ERROR, "Parse error: the body is not valid JSON") from None


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
    if "id" not in data:
        return Message(method=method, params=params, is_notification=True, raw=data)
    request_id = data["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer')
    return Message(method=method, params=params, id=request_id, raw=data)
