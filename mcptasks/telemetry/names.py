"""Attribute, event and instrument names: MCP's semantic conventions where
they name a thing, ``mcptasks.*`` for the rest (docs/observability.md lists
them all)."""

from __future__ import annotations

# OpenTelemetry MCP and GenAI semantic conventions.
MCP_METHOD = "mcp.method.name"
MCP_PROTOCOL_VERSION = "mcp.protocol.version"
MCP_SESSION_ID = "mcp.session.id"
JSONRPC_REQUEST_ID = "jsonrpc.request.id"
RPC_STATUS_CODE = "rpc.response.status_code"
ERROR_TYPE = "error.type"
HTTP_STATUS_CODE = "http.response.status_code"
TOOL_NAME = "gen_ai.tool.name"
PROMPT_NAME = "gen_ai.prompt.name"
OPERATION_NAME = "gen_ai.operation.name"
EXECUTE_TOOL = "execute_tool"
QUEUE_NAME = "messaging.destination.name"

# mcptasks' own.
TASK_ID = "mcptasks.task.id"
TASK_STATUS = "mcptasks.task.status"
RUN_ATTEMPT = "mcptasks.run.attempt"
#: The tool's attempt (1, then 2... after retries on its ``retry_on``); not a lost run's count.
TOOL_ATTEMPT = "mcptasks.tool.attempt"
RUN_OUTCOME = "mcptasks.run.outcome"
#: A finished task's outcome on the task counters: ``success``,
#: ``tool_error`` (``TOOL_ERROR``: the tool's ``isError`` result, whatever the
#: era's status), ``error`` (a protocol failure) or ``cancelled``.
TASK_OUTCOME = "mcptasks.task.outcome"
INPUT_KEYS = "mcptasks.input.keys"
EVENT_INPUT_ASKED = "mcptasks.input.asked"
EVENT_INPUT_ANSWERED = "mcptasks.input.answered"
EVENT_RUN_OUTCOME = "mcptasks.run.outcome"

#: ``error.type`` of a tool call answered with ``isError``.
TOOL_ERROR = "tool_error"

#: JSON-RPC errors that are the client's: recorded, never a server error.
CLIENT_ERRORS = frozenset({-32700, -32600, -32601, -32602})

#: The first protocol version without sessions: no ``mcp.session.id`` from it on.
SESSIONLESS_VERSION = "2026-07-28"

INSTRUMENTATION_NAME = "mcptasks"
