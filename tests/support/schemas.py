"""JSON Schema validation against the pinned copies in ``tests/schemas``."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
CORE = "2026-07-28.schema.json"
TASKS = "ext-tasks.schema.json"

#: Which schema definition a successful result of a core method must match.
CORE_RESULT_DEFS = {
    "server/discover": "DiscoverResult",
    "tools/list": "ListToolsResult",
    "tools/call": "CallToolResult",
}

#: tasks/* results, from the extension schema.
TASK_RESULT_DEFS = {
    "tasks/get": "GetTaskResult",
    "tasks/update": "UpdateTaskResult",
    "tasks/cancel": "CancelTaskResult",
}

#: MCP error codes whose whole response has a definition in the core schema.
ERROR_RESPONSE_DEFS = {
    -32020: "HeaderMismatchError",
    -32021: "MissingRequiredClientCapabilityError",
    -32022: "UnsupportedProtocolVersionError",
}
#: JSON-RPC error codes whose error object has a definition.
ERROR_OBJECT_DEFS = {
    -32700: "ParseError",
    -32600: "InvalidRequestError",
    -32601: "MethodNotFoundError",
    -32602: "InvalidParamsError",
    -32603: "InternalError",
}


@cache
def _document(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / name).read_text())


@cache
def validator(document: str, definition: str) -> Draft202012Validator:
    root = _document(document)
    if definition not in root["$defs"]:
        raise KeyError(f"{definition} is not defined in {document}")
    schema = {**root, "$ref": f"#/$defs/{definition}"}
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def errors(document: str, definition: str, instance: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator(document, definition).iter_errors(instance)
    ]


def assert_valid(document: str, definition: str, instance: Any) -> None:
    problems = errors(document, definition, instance)
    assert not problems, f"not a valid {definition}: {problems}\n{json.dumps(instance, indent=1)[:3000]}"


def assert_create_task_result(result: Any) -> None:
    assert_valid(TASKS, "CreateTaskResult", result)


def assert_detailed_task(result: Any) -> None:
    assert_valid(TASKS, "GetTaskResult", result)


def assert_valid_message(method: str, body: Any) -> None:
    """Validate one server message the way the conformance suite does: the
    envelope, then the error by code or the result by method."""
    assert isinstance(body, dict), f"expected a JSON object, got {body!r}"
    if "error" in body:
        assert_valid(CORE, "JSONRPCErrorResponse", body)
        code = body["error"].get("code")
        if code in ERROR_RESPONSE_DEFS:
            assert_valid(CORE, ERROR_RESPONSE_DEFS[code], body)
        elif code in ERROR_OBJECT_DEFS:
            assert_valid(CORE, ERROR_OBJECT_DEFS[code], body["error"])
        return
    assert_valid(CORE, "JSONRPCResultResponse", body)
    result = body["result"]
    result_type = result.get("resultType")
    if result_type == "input_required":
        assert_valid(CORE, "InputRequiredResult", result)
    elif result_type == "task":
        assert_create_task_result(result)
    elif method in TASK_RESULT_DEFS:
        assert_valid(TASKS, TASK_RESULT_DEFS[method], result)
    elif method in CORE_RESULT_DEFS:
        assert_valid(CORE, CORE_RESULT_DEFS[method], result)
    else:
        assert_valid(CORE, "Result", result)


def assert_valid_notification(message: Any) -> None:
    assert_valid(CORE, "JSONRPCNotification", message)
    definition = NOTIFICATION_DEFS.get(message.get("method"))
    if definition is not None:
        assert_valid(CORE, definition, message)


NOTIFICATION_DEFS = {
    "notifications/progress": "ProgressNotification",
    "notifications/message": "LoggingMessageNotification",
}
