"""The 2026-07-28 wire with the ``io.modelcontextprotocol/tasks`` extension.

Sessionless: every request carries its protocol version and capabilities in
``params._meta``; nothing is remembered between requests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.core import signing

from .. import lifecycle
from ..conf import settings
from ..context import ToolContext
from ..errors import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    TASKS_EXTENSION,
    UNSUPPORTED_VERSION,
    HandOff,
    InputNeeded,
    InvalidParams,
    ProtocolError,
    TaskNotFound,
    missing_tasks_extension,
)
from ..execution import invoke
from ..identity import Caller
from ..models import Era, InputRequest, InputRequestState, Task, TaskStatus
from ..registry import Tool, registry
from .jsonrpc import Message

PROTOCOL_VERSION = "2026-07-28"
MODERN_VERSIONS = (PROTOCOL_VERSION,)

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

_TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
#: Methods of other eras that this wire must answer with -32601.
_REMOVED_METHODS = ("tasks/result", "tasks/list", "initialize", "ping", "logging/setLevel")


class HeaderMismatch(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(HEADER_MISMATCH, f"Header mismatch: {message}")


def supported_versions() -> list[str]:
    return list(MODERN_VERSIONS)


def is_modern(message: Message) -> bool:
    meta = message.params.get("_meta")
    return isinstance(meta, dict) and META_VERSION in meta


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def server_info() -> dict[str, str]:
    return {"name": settings.SERVER_NAME, "version": settings.SERVER_VERSION}


# Header validation -------------------------------------------------------------------

_B64_PREFIX, _B64_SUFFIX = "=?base64?", "?="


def decode_header_value(value: str) -> str:
    """Undo the ``=?base64?...?=`` sentinel encoding of ``Mcp-Name`` values."""
    if value.startswith(_B64_PREFIX) and value.endswith(_B64_SUFFIX) and len(value) >= len(_B64_PREFIX) + 2:
        encoded = value[len(_B64_PREFIX) : -len(_B64_SUFFIX)]
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise HeaderMismatch("Mcp-Name is not valid base64-encoded UTF-8") from None
    return value


def validate_headers(message: Message, headers: Mapping[str, str]) -> None:
    """The routing headers must mirror the body (-32020 otherwise)."""
    meta = message.params.get("_meta") or {}
    body_version = meta.get(META_VERSION)
    header_version = headers.get("mcp-protocol-version")
    if header_version is None:
        raise HeaderMismatch("the MCP-Protocol-Version header is required")
    if header_version != body_version:
        raise HeaderMismatch(
            f"MCP-Protocol-Version header value '{header_version}' does not match body value '{body_version}'"
        )
    header_method = headers.get("mcp-method")
    if header_method is None:
        raise HeaderMismatch("the Mcp-Method header is required")
    if header_method != message.method:
        raise HeaderMismatch(f"Mcp-Method header value '{header_method}' does not match body value '{message.method}'")
    raw_name = headers.get("mcp-name")
    if message.method == "tools/call":
        body_name = message.params.get("name")
        if raw_name is None:
            raise HeaderMismatch("the Mcp-Name header is required for tools/call")
        name = decode_header_value(raw_name)
        if name != body_name:
            raise HeaderMismatch(f"Mcp-Name header value '{name}' does not match body value '{body_name}'")
    elif message.method in _TASK_METHODS and raw_name is not None:
        # Some clients omit Mcp-Name on tasks/*: tolerate absence, reject a wrong one.
        body_task = message.params.get("taskId")
        name = decode_header_value(raw_name)
        if name != body_task:
            raise HeaderMismatch(f"Mcp-Name header value '{name}' does not match body value '{body_task}'")


def check_version(message: Message) -> tuple[str, dict[str, Any]]:
    """The request's protocol version and capabilities, validated."""
    meta = message.params.get("_meta")
    if not isinstance(meta, dict):
        raise InvalidParams("Missing required _meta field: io.modelcontextprotocol/protocolVersion")
    version = meta.get(META_VERSION)
    if not isinstance(version, str):
        raise InvalidParams(f"Missing required _meta field: {META_VERSION}")
    if version not in MODERN_VERSIONS:
        raise ProtocolError(
            UNSUPPORTED_VERSION,
            "Unsupported protocol version",
            {"supported": supported_versions(), "requested": version},
        )
    capabilities = meta.get(META_CAPABILITIES)
    if not isinstance(capabilities, dict):
        raise InvalidParams(f"Missing required _meta field: {META_CAPABILITIES}")
    return version, capabilities


def has_tasks_extension(capabilities: Mapping[str, Any]) -> bool:
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)


# Results -------------------------------------------------------------------------


def complete(value: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"resultType": "complete", **(value or {})}
    meta = dict(out.get("_meta") or {})
    meta.setdefault(META_SERVER_INFO, server_info())
    out["_meta"] = meta
    return out


def task_fields(task: Task) -> dict[str, Any]:
    data: dict[str, Any] = {
        "taskId": task.id,
        "status": task.status,
        "createdAt": iso(task.created_at),
        "lastUpdatedAt": iso(task.updated_at),
        "ttlMs": task.ttl_ms,
        "pollIntervalMs": task.poll_interval_ms,
    }
    if task.status_message:
        data["statusMessage"] = task.status_message
    return data


def pending_input_requests(task_id: str) -> dict[str, Any]:
    rows = InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).values_list(
        "key", "method", "params"
    )
    return {key: {"method": method, "params": params} for key, method, params in rows}


def detailed_task(task: Task) -> dict[str, Any]:
    """The DetailedTask for ``task``: what tasks/get and notifications carry."""
    data = task_fields(task)
    if task.status == TaskStatus.INPUT_REQUIRED:
        data["inputRequests"] = pending_input_requests(task.id)
    elif task.status == TaskStatus.COMPLETED:
        data["result"] = {"resultType": "complete", **(task.result or {})}
    elif task.status == TaskStatus.FAILED:
        data["error"] = task.error or {"code": -32603, "message": task.status_message or "Task failed"}
    return data


def create_task_result(task: Task) -> dict[str, Any]:
    return {"resultType": "task", **task_fields(task), "_meta": {META_SERVER_INFO: server_info()}}


# Request state (MRTR) --------------------------------------------------------------

_STATE_SALT = "mcptasks.request_state"


def _call_digest(owner: str, tool: str, arguments: Any) -> str:
    canonical = json.dumps([owner, tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def sign_request_state(owner: str, tool: str, arguments: Any, answers: Mapping[str, Any]) -> str:
    """Answers gathered so far, bound to the caller, the tool and its arguments."""
    payload = {"d": _call_digest(owner, tool, arguments), "a": dict(answers)}
    return signing.dumps(payload, salt=_STATE_SALT, compress=True)


def load_request_state(state: Any, owner: str, tool: str, arguments: Any) -> dict[str, Any]:
    """Verify a ``requestState`` and return the answers it carries.

    Tampered, expired or foreign state is rejected with -32602: it binds the
    caller, the tool and its arguments.
    """
    if not isinstance(state, str):
        raise InvalidParams("Invalid requestState: expected a string")
    try:
        payload = signing.loads(state, salt=_STATE_SALT, max_age=settings.REQUEST_STATE_MAX_AGE)
    except signing.SignatureExpired:
        raise InvalidParams("Invalid requestState: it has expired; retry the call without it") from None
    except signing.BadSignature:
        raise InvalidParams("Invalid requestState: verification failed") from None
    if not isinstance(payload, dict) or payload.get("d") != _call_digest(owner, tool, arguments):
        raise InvalidParams("Invalid requestState: it belongs to a different request")
    return dict(payload.get("a") or {})


# Handlers ----------------------------------------------------------------------------


class Request:
    """One modern request, validated: the handlers' input."""

    def __init__(self, message: Message, caller: Caller, capabilities: dict[str, Any]) -> None:
        self.message = message
        self.params = message.params
        self.caller = caller
        self.capabilities = capabilities

    @property
    def tasks_enabled(self) -> bool:
        return has_tasks_extension(self.capabilities)


def discover(req: Request) -> dict[str, Any]:
    result: dict[str, Any] = {
        "supportedVersions": supported_versions(),
        "capabilities": server_capabilities(),
        "ttlMs": settings.LIST_TTL_MS,
        "cacheScope": "public",
    }
    if settings.INSTRUCTIONS:
        result["instructions"] = settings.INSTRUCTIONS
    return complete(result)


def server_capabilities() -> dict[str, Any]:
    return {"tools": {"listChanged": True}, "extensions": {TASKS_EXTENSION: {}}}


def describe_tool(tool: Tool) -> dict[str, Any]:
    return tool.describe()


def list_tools(req: Request) -> dict[str, Any]:
    cursor = req.params.get("cursor")
    if cursor is not None:
        raise InvalidParams("Invalid cursor: this server returns every tool on one page")
    return complete(
        {
            "tools": [describe_tool(t) for t in registry.all()],
            "ttlMs": settings.LIST_TTL_MS,
            "cacheScope": "public",
        }
    )


def _lookup_tool(params: Mapping[str, Any]) -> Tool:
    name = params.get("name")
    if not isinstance(name, str):
        raise InvalidParams('tools/call needs "name" (a string)')
    tool = registry.get(name)
    if tool is None:
        raise InvalidParams(f"Unknown tool: {name}")
    return tool


def call_tool(req: Request) -> dict[str, Any]:
    tool = _lookup_tool(req.params)
    arguments = req.params.get("arguments") or {}
    kwargs = tool.validate_arguments(arguments)
    mode = tool.task
    if mode == "required" and not req.tasks_enabled:
        raise missing_tasks_extension()
    wants_task = req.tasks_enabled and mode in ("optional", "required", "auto")

    # MRTR: answers from earlier rounds ride in requestState; new ones in inputResponses.
    answers: dict[str, Any] = {}
    if "requestState" in req.params:
        answers = load_request_state(req.params["requestState"], req.caller.owner, tool.name, arguments)
    responses = req.params.get("inputResponses")
    if responses is not None:
        if not isinstance(responses, dict):
            raise InvalidParams("inputResponses must be an object")
        answers.update(responses)

    if wants_task and not tool.starts_inline:
        return _create_task(req, tool, arguments, {})

    ctx = ToolContext(
        owner=req.caller.owner,
        user=req.caller.user,
        capabilities=req.capabilities,
        answers=answers,
        can_hand_off=wants_task,
    )
    try:
        result = invoke(tool, ctx, kwargs)
    except InputNeeded as need:
        state = sign_request_state(req.caller.owner, tool.name, arguments, answers)
        return {"resultType": "input_required", "inputRequests": need.requests, "requestState": state}
    except HandOff:
        answered = {
            key: lifecycle.Answer(method=q.method, params=q.params, response=answers[key])
            for key, q in ctx.asked.items()
            if key in answers
        }
        return _create_task(req, tool, arguments, answered)
    return complete(result)


def _create_task(
    req: Request, tool: Tool, arguments: dict[str, Any], answered: Mapping[str, lifecycle.Answer]
) -> dict[str, Any]:
    task = lifecycle.create_task(
        owner=req.caller.owner,
        tool_name=tool.name,
        arguments=arguments,
        era=Era.MODERN,
        client_capabilities=req.capabilities,
        ttl_ms=tool.ttl_ms,
        poll_interval_ms=tool.poll_interval_ms,
        answered=answered,
    )
    # create_task committed: a tasks/get for this id resolves from here on.
    if tool.task == "auto":
        from ..waiting import wait_for_terminal

        done = wait_for_terminal(task.id, settings.AUTO_TASK_BUDGET_SECONDS)
        if done is not None and done.status == TaskStatus.COMPLETED:
            return complete(done.result or {})
    return create_task_result(task)


def _task_for(req: Request) -> Task:
    """The caller's task named by ``params.taskId``; -32021 first, then -32602."""
    if not req.tasks_enabled:
        raise missing_tasks_extension()
    task_id = req.params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidParams('"taskId" (a string) is required')
    task = Task.objects.filter(pk=task_id, owner=req.caller.owner).first()
    if task is None:
        raise TaskNotFound()
    return task


def get_task(req: Request) -> dict[str, Any]:
    return complete(detailed_task(_task_for(req)))


def update_task(req: Request) -> dict[str, Any]:
    responses = req.params.get("inputResponses")
    task = _task_for(req)
    if not isinstance(responses, dict):
        raise InvalidParams('"inputResponses" (an object) is required')
    lifecycle.submit_input(task.id, responses, actor=lifecycle.client_actor(req.caller.owner))
    return complete()


def cancel_task(req: Request) -> dict[str, Any]:
    task = _task_for(req)
    lifecycle.cancel(task.id, actor=lifecycle.client_actor(req.caller.owner))
    return complete()


HANDLERS: dict[str, Callable[[Request], dict[str, Any]]] = {
    "server/discover": discover,
    "tools/list": list_tools,
    "tools/call": call_tool,
    "tasks/get": get_task,
    "tasks/update": update_task,
    "tasks/cancel": cancel_task,
}


def handle(message: Message, caller: Caller, headers: Mapping[str, str]) -> dict[str, Any]:
    """Validate and run one modern request; raises ``ProtocolError``."""
    _version, capabilities = check_version(message)
    validate_headers(message, headers)
    handler = HANDLERS.get(message.method)
    if handler is None:
        raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {message.method}")
    return handler(Request(message, caller, capabilities))


def http_status(code: int) -> int:
    """HTTP status for a JSON-RPC error on the modern wire."""
    if code == METHOD_NOT_FOUND:
        return 404
    if code in (-32700, -32600, INVALID_PARAMS, HEADER_MISMATCH, -32021, UNSUPPORTED_VERSION):
        return 400
    return 200 if code > -32000 or code < -32768 else 500
