"""A Python client for MCP tasks: the ``io.modelcontextprotocol/tasks``
extension for the official SDK's client (``mcp`` 2.3, ``pip install
"mcptasks[client]"``).

The SDK speaks the 2026-07-28 wire but ships no tasks runtime. Given to its
``Client``, ``TasksExtension`` declares the extension and resolves each task
handle a ``tools/call`` returns into the tool's ``CallToolResult``::

    from mcp import Client
    from mcptasks.client import TasksExtension

    def confirm(key, request):  # a task's question, answered with tasks/update
        return {"action": "accept", "content": {"confirm": True}}

    async with Client(url, extensions=[TasksExtension(on_input=confirm)]) as client:
        result = await client.call_tool("confirm_delete", {"filename": "a.txt"})

It follows the task by polling ``tasks/get`` at the server's ``pollIntervalMs``
or, with ``listen=True``, from the ``notifications/tasks`` of a
``subscriptions/listen`` stream; it answers ``inputRequests`` through
``on_input``, keyed as they were asked; a ``failed`` task raises
``TaskFailedError`` and a ``cancelled`` one ``TaskCancelledError``. Cancelling
the awaiting call cancels the task on the server (``tasks/cancel``).
``get_task``, ``update_task``, ``cancel_task`` and ``wait_for_task`` are the
same exchanges for a client that holds a handle itself (``call_tool(...,
allow_claimed=True)``).

This module is the client only: it imports nothing of the server.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

__all__ = [
    "TASKS_EXTENSION",
    "TERMINAL_STATUSES",
    "CreateTaskResult",
    "DetailedTask",
    "InputHandler",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskInputRequiredError",
    "TasksExtension",
    "cancel_task",
    "get_task",
    "update_task",
    "wait_for_task",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})

#: Answers one input request: ``(key, request) -> response``, where request is
#: ``{"method": "elicitation/create" | "sampling/createMessage" | "roots/list",
#: "params": ...}`` and the response is that method's result (an
#: ``ElicitResult``, ``CreateMessageResult`` or ``ListRootsResult`` as a dict).
#: May be a coroutine function. ``None`` leaves the key unanswered.
InputHandler = Callable[[str, dict[str, Any]], Any]

INTERNAL_ERROR = -32603
#: Used when the server suggests no interval (seconds).
DEFAULT_POLL_SECONDS = 1.0


# The wire shapes (2026-07-28 + the tasks extension) ---------------------------------


class CreateTaskResult(types.Result):
    """A ``tools/call`` answered with a task handle (``resultType: "task"``)."""

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"]
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    status_message: str | None = None


class DetailedTask(types.Result):
    """A task as ``tasks/get`` and ``notifications/tasks`` carry it."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    status: str
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, dict[str, Any]] | None = None


class _TaskIdParams(types.RequestParams):
    task_id: str


class _UpdateTaskParams(_TaskIdParams):
    input_responses: dict[str, Any]


class _GetTaskRequest(types.Request[_TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskIdParams
    name_param: ClassVar[str | None] = "taskId"


class _UpdateTaskRequest(types.Request[_UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: _UpdateTaskParams
    name_param: ClassVar[str | None] = "taskId"


class _CancelTaskRequest(types.Request[_TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskIdParams
    name_param: ClassVar[str | None] = "taskId"


class _Ack(types.Result):
    model_config = ConfigDict(extra="allow")


# Errors -------------------------------------------------------------------------------


class TaskFailedError(MCPError):
    """The task ended ``failed``: its JSON-RPC error, as ``code``, ``message``, ``data``."""

    def __init__(self, task_id: str, error: Mapping[str, Any] | None) -> None:
        error = error or {}
        code = error.get("code")
        super().__init__(
            code if isinstance(code, int) else INTERNAL_ERROR,
            str(error.get("message") or f"task {task_id} failed"),
            error.get("data"),
        )
        self.task_id = task_id


class TaskCancelledError(MCPError):
    """The task ended ``cancelled`` (by this client, another, or an operator)."""

    def __init__(self, task_id: str, status_message: str | None = None) -> None:
        super().__init__(INTERNAL_ERROR, status_message or f"task {task_id} was cancelled")
        self.task_id = task_id


class TaskInputRequiredError(MCPError):
    """The task asks for input and no ``on_input`` answers it (it stays
    ``input_required``: answer with ``update_task``, then ``wait_for_task``)."""

    def __init__(self, task: DetailedTask) -> None:
        keys = sorted(task.input_requests or {})
        super().__init__(INTERNAL_ERROR, f"task {task.task_id} is waiting for input: {keys}")
        self.task = task


# The exchanges ------------------------------------------------------------------------


async def get_task(session: ClientSession, task_id: str) -> DetailedTask:
    """``tasks/get``: the task's state now."""
    return await session.send_request(_GetTaskRequest(params=_TaskIdParams(task_id=task_id)), DetailedTask)


async def update_task(session: ClientSession, task_id: str, input_responses: Mapping[str, Any]) -> None:
    """``tasks/update``: answers keyed as the task's ``inputRequests`` were."""
    params = _UpdateTaskParams(task_id=task_id, input_responses=dict(input_responses))
    await session.send_request(_UpdateTaskRequest(params=params), _Ack)


async def cancel_task(session: ClientSession, task_id: str) -> None:
    """``tasks/cancel``: acknowledged even for a task that already ended."""
    await session.send_request(_CancelTaskRequest(params=_TaskIdParams(task_id=task_id)), _Ack)


def _outcome(task: DetailedTask) -> types.CallToolResult:
    if task.status == "completed":
        return types.CallToolResult.model_validate(task.result or {"content": []})
    if task.status == "failed":
        raise TaskFailedError(task.task_id, task.error)
    raise TaskCancelledError(task.task_id, task.status_message)


async def _answers(task: DetailedTask, on_input: InputHandler, answered: set[str]) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for key, request in (task.input_requests or {}).items():
        if key in answered:
            continue
        response = on_input(key, request)
        if inspect.isawaitable(response):
            response = await response
        if response is not None:
            responses[key] = response
    return responses


class _Follower:
    """Where a wait learns of its task's changes: ``tasks/get`` each
    interval, or notifications that wake it (with ``tasks/get`` as a slow
    safety net)."""

    def __init__(self, session: ClientSession, task_id: str) -> None:
        self.session, self.task_id = session, task_id
        self.latest: DetailedTask | None = None
        self.changed = anyio.Event()

    def push(self, task: DetailedTask) -> None:
        self.latest = task
        self.changed.set()

    async def next(self, seconds: float) -> DetailedTask:
        with anyio.move_on_after(seconds):
            await self.changed.wait()
        self.changed = anyio.Event()
        pushed, self.latest = self.latest, None
        return pushed if pushed is not None else await get_task(self.session, self.task_id)


async def wait_for_task(
    session: ClientSession,
    task_id: str,
    *,
    on_input: InputHandler | None = None,
    on_status: Callable[[DetailedTask], object] | None = None,
    poll_interval_ms: int | None = None,
    timeout: float | None = None,
    cancel_on_exit: bool = True,
    _follower: _Follower | None = None,
) -> types.CallToolResult:
    """Follow ``task_id`` to its end and return its ``CallToolResult``.

    Polls ``tasks/get`` at the server's ``pollIntervalMs`` (the latest
    answer's, else ``poll_interval_ms``); answers each new input request
    through ``on_input`` (``TaskInputRequiredError`` without one); calls
    ``on_status`` with every state seen. ``timeout`` (seconds) raises
    ``TimeoutError``. If the wait is cancelled or times out and
    ``cancel_on_exit`` holds, the task is cancelled on the server.
    """
    follower = _follower or _Follower(session, task_id)
    answered: set[str] = set()
    interval = (poll_interval_ms or 0) / 1000 or DEFAULT_POLL_SECONDS
    done = False
    try:
        with anyio.fail_after(timeout):
            task = await get_task(session, task_id)
            while True:
                if on_status is not None:
                    on_status(task)
                if task.status in TERMINAL_STATUSES:
                    done = True
                    return _outcome(task)
                if task.poll_interval_ms:
                    interval = task.poll_interval_ms / 1000
                if task.status == "input_required" and task.input_requests:
                    if on_input is None:
                        done = True
                        raise TaskInputRequiredError(task)
                    responses = await _answers(task, on_input, answered)
                    if responses:
                        await update_task(session, task_id, responses)
                        answered.update(responses)
                        task = await get_task(session, task_id)
                        continue
                task = await follower.next(interval)
    finally:
        if not done and cancel_on_exit:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await cancel_task(session, task_id)


class _ListenRequest(types.Request[types.SubscriptionsListenRequestParams, Literal["subscriptions/listen"]]):
    method: Literal["subscriptions/listen"] = "subscriptions/listen"
    params: types.SubscriptionsListenRequestParams


class TasksExtension(ClientExtension):
    """The tasks extension for ``mcp.Client(extensions=[...])``.

    - ``on_input(key, request)``: answers a task's input requests (sync or
      async); without it a task that asks raises ``TaskInputRequiredError``.
    - ``listen``: follow tasks from a ``subscriptions/listen`` stream of
      ``notifications/tasks`` instead of polling; ``tasks/get`` still runs
      every ``safety_poll_seconds`` in case the stream drops.
    - ``timeout``: the longest a call waits for its task (seconds; ``None``:
      no limit). A call that times out or is cancelled cancels its task.
    - ``on_created(handle)`` and ``on_status(task)``: observe each handle and
      each state seen (a status message, a question).
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        *,
        on_input: InputHandler | None = None,
        listen: bool = False,
        timeout: float | None = None,
        safety_poll_seconds: float = 30.0,
        on_created: Callable[[CreateTaskResult], object] | None = None,
        on_status: Callable[[DetailedTask], object] | None = None,
    ) -> None:
        self.on_input = on_input
        self.listen = listen
        self.timeout = timeout
        self.safety_poll_seconds = safety_poll_seconds
        self.on_created = on_created
        self.on_status = on_status
        self._followers: dict[str, _Follower] = {}

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._resolve)]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks", params_type=DetailedTask, handler=self._notified)]

    async def _notified(self, task: DetailedTask) -> None:
        follower = self._followers.get(task.task_id)
        if follower is not None:
            follower.push(task)

    async def _resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        if self.on_created is not None:
            self.on_created(created)
        if not self.listen:
            return await self._wait(ctx.session, created, None)
        follower = _WakingFollower(ctx.session, created.task_id, self.safety_poll_seconds)
        self._followers[created.task_id] = follower
        outcome: types.CallToolResult | BaseException | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_listen, ctx.session, created.task_id)
                try:
                    outcome = await self._wait(ctx.session, created, follower)
                except Exception as exc:  # raised below, outside the group (not as an ExceptionGroup)
                    outcome = exc
                finally:
                    group.cancel_scope.cancel()
        finally:
            self._followers.pop(created.task_id, None)
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    async def _wait(
        self, session: ClientSession, created: CreateTaskResult, follower: _Follower | None
    ) -> types.CallToolResult:
        return await wait_for_task(
            session,
            created.task_id,
            on_input=self.on_input,
            on_status=self.on_status,
            poll_interval_ms=created.poll_interval_ms,
            timeout=self.timeout,
            _follower=follower,
        )


class _WakingFollower(_Follower):
    """Woken by notifications; reads ``tasks/get`` only when none came for a while."""

    def __init__(self, session: ClientSession, task_id: str, safety_seconds: float) -> None:
        super().__init__(session, task_id)
        self.safety_seconds = safety_seconds

    async def next(self, seconds: float) -> DetailedTask:
        return await super().next(max(seconds, self.safety_seconds))


async def _listen(session: ClientSession, task_id: str) -> None:
    """One ``subscriptions/listen`` for ``task_id``; its notifications reach the
    extension's binding. Ends with the stream (the wait's safety poll covers a drop)."""
    wanted = types.SubscriptionFilter.model_validate({"taskIds": [task_id]})
    request = _ListenRequest(params=types.SubscriptionsListenRequestParams(notifications=wanted))
    try:
        await session.send_request(request, _Ack, request_read_timeout_seconds=math.inf)
    except (MCPError, TimeoutError):
        return
