"""The tasks extension for the official Python SDK's client (``mcp`` 2.3.0).

The SDK speaks the 2026-07-28 wire and lets a client extension claim a new
``resultType``; it does not ship the tasks extension itself. This is the
smallest faithful one: it declares ``io.modelcontextprotocol/tasks``, claims
``resultType: "task"`` on tools/call, and resolves the handle by polling
``tasks/get`` (sent through the SDK session, so the SDK stamps ``_meta`` and
the ``Mcp-Method``/``Mcp-Name`` headers itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

TASKS_EXT = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")


class CreateTaskResult(types.Result):
    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"]
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTaskRequest(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class DetailedTask(types.Result):
    model_config = ConfigDict(extra="allow")

    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class AckResult(types.Result):
    model_config = ConfigDict(extra="forbid")

    result_type: Literal["complete"]


class TasksExtension(ClientExtension):
    """Resolves task handles; answers a task's elicitations with ``answer``."""

    identifier = TASKS_EXT

    def __init__(self, answer: Any = None, timeout: float = 30.0) -> None:
        self.answer = answer
        self.timeout = timeout
        #: Every DetailedTask seen while polling (for assertions).
        self.seen: list[DetailedTask] = []
        self.created: list[CreateTaskResult] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    async def resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        session = ctx.session
        params = TaskIdParams(task_id=created.task_id)
        with anyio.fail_after(self.timeout):
            while True:
                task = await session.send_request(GetTaskRequest(params=params), DetailedTask)
                self.seen.append(task)
                if task.status == "completed":
                    return types.CallToolResult.model_validate(task.result)
                if task.status == "failed":
                    error = task.error or {}
                    raise MCPError(error.get("code", -32603), error.get("message", "task failed"), error.get("data"))
                if task.status == "cancelled":
                    raise MCPError(-32603, f"task {created.task_id} was cancelled")
                if task.status == "input_required" and task.input_requests and self.answer is not None:
                    responses = {key: self.answer(key, request) for key, request in task.input_requests.items()}
                    ack = await session.send_request(
                        UpdateTaskRequest(params=UpdateTaskParams(task_id=created.task_id, input_responses=responses)),
                        AckResult,
                    )
                    assert ack.result_type == "complete"
                await anyio.sleep((task.poll_interval_ms or created.poll_interval_ms or 200) / 1000)


async def cancel_task(session: Any, task_id: str) -> AckResult:
    return await session.send_request(CancelTaskRequest(params=TaskIdParams(task_id=task_id)), AckResult)


async def get_task(session: Any, task_id: str) -> DetailedTask:
    return await session.send_request(GetTaskRequest(params=TaskIdParams(task_id=task_id)), DetailedTask)
