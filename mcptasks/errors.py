"""Errors a tool or the protocol layer can raise, and the control-flow signals
that stop a tool run early.

* ``ToolError``: the tool ran and failed in a way the model can act on. The call
  ends with a result whose ``isError`` is true (a task ends ``completed``).
* ``ProtocolError``: a JSON-RPC error. Raised inside a task, the task ends
  ``failed`` with that error.
"""

from __future__ import annotations

from typing import Any

# JSON-RPC 2.0 and MCP error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022
#: 2025-era code for an unknown resource (2026-07-28 uses -32602).
RESOURCE_NOT_FOUND = -32002
#: Outside the JSON-RPC reserved range, as the MCP spec asks of
#: implementation-defined codes.
RATE_LIMITED = -31000

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class ToolError(Exception):
    """A tool-level failure: reported in the result with ``isError: true``."""

    def __init__(self, message: str, *, content: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.content = content


class ProtocolError(Exception):
    """A JSON-RPC error response.

    ``http_status`` overrides the wire's default HTTP status for the code (a
    -32602 for a missing ``_meta`` field is a 400; other -32602s are not).
    """

    def __init__(self, code: int, message: str, data: Any = None, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class InvalidParams(ProtocolError):
    def __init__(self, message: str, data: Any = None, *, http_status: int | None = None) -> None:
        super().__init__(INVALID_PARAMS, message, data, http_status=http_status)


class MissingCapability(ProtocolError):
    def __init__(self, required: dict[str, Any], message: str | None = None) -> None:
        super().__init__(
            MISSING_CAPABILITY,
            message or "Missing required client capability",
            {"requiredCapabilities": required},
        )


def missing_tasks_extension() -> MissingCapability:
    return MissingCapability({"extensions": {TASKS_EXTENSION: {}}})


class TaskNotFound(InvalidParams):
    """Unknown, pruned or someone else's task: deliberately indistinguishable."""

    def __init__(self) -> None:
        super().__init__("Failed to retrieve task: Task not found")


# Control flow inside a tool run. Not errors: they end the run early.


class ControlFlow(BaseException):
    """Base of the signals a tool must not swallow (hence ``BaseException``)."""


class InputNeeded(ControlFlow):
    """The tool asked questions that have no answers yet."""

    def __init__(self, requests: dict[str, dict[str, Any]]) -> None:
        super().__init__(f"input needed: {sorted(requests)}")
        self.requests = requests


class TaskCancelled(ControlFlow):
    """The task was cancelled; the tool stops at its next check."""


class SoftTimeLimitExceeded(ControlFlow):
    """The run reached its tool's ``soft_time_limit``: raised where a cancel
    would be (``ctx.sleep``, ``ctx.check_cancelled``, ``ctx.wait``). The tool
    may catch it to clean up; let through, the task ends as a tool error
    naming the limit."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"the soft time limit of {limit:g} s was reached")
        self.limit = limit


class ToolRetry(ControlFlow):
    """The tool raised ``error``, an exception of its ``retry_on``: the task
    run may schedule another attempt (``invoke`` raises it, the worker
    catches it)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class HandOff(ControlFlow):
    """The inline phase of a task tool is done: continue as a durable task."""
