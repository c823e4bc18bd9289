"""The 2025-11-25 experimental task methods: ``tasks/get``, ``tasks/result``,
``tasks/list`` and ``tasks/cancel``, on the tasks a session may see
(:class:`SessionTasks`): ``task_methods``' methods, in 2025 shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core import signing

from ...errors import INTERNAL_ERROR, InvalidParams, ProtocolError
from ...models import Task, TaskStatus
from ...tasks import lifecycle
from .. import authorization, jsonrpc, task_methods
from ..streaming import Stream
from ..task_methods import Route, now
from . import sessions as legacy_sessions
from . import streams as legacy_streams
from .calls import Call, Reply
from .sessions import related, task_object

#: Tasks per ``tasks/list`` page.
LIST_PAGE_SIZE = 50
_CURSOR_SALT = "mcptasks.legacy.tasks_list"


class SessionTasks(Route):
    """The thread route, with the tasks the call's session may see."""

    def __init__(self, call: Call) -> None:
        self.call = call

    async def lookup(self, task_id: str, owner: str) -> Task | None:
        return legacy_sessions.visible_tasks(self.call.caller, self.call.session).filter(pk=task_id).first()

    async def poll(self, task_id: str, owner: str, actor: str | None) -> Task | None:
        return await self.lookup(task_id, owner)


def get_task(call: Call) -> Reply:
    return now(task_methods.get(SessionTasks(call), call.caller, call.params, task_object, outcome=False))


def task_outcome(task: Task, *, actor: str) -> dict[str, Any] | ProtocolError:
    """What ``tasks/result`` gives for a terminal task: exactly what the tool
    call would have returned (its result, marked with the related task, or
    its JSON-RPC error). A cancelled call has no result: that is an error."""
    lifecycle.note_result_retrieved(task, actor=actor)
    if task.status == TaskStatus.CANCELLED:
        return ProtocolError(
            INTERNAL_ERROR,
            f"The task was cancelled: {task.status_message or 'it has no result'}",
            {"taskId": task.id, "status": task.status},
        )
    if task.result is not None and task.error is None:
        result = dict(task.result)
        result["_meta"] = {**(result.get("_meta") or {}), **related(task.id)}
        return result
    error = task.error or {}
    return ProtocolError(
        error.get("code", INTERNAL_ERROR), error.get("message", task.status_message or "Task failed"), error.get("data")
    )


def task_result(call: Call) -> Reply:
    task = now(task_methods.task_for(SessionTasks(call), call.caller, call.params))
    actor = lifecycle.client_actor(call.caller.owner)
    request_id = call.message.id
    assert request_id is not None  # a request: notifications never reach a handler
    if task.is_terminal:
        outcome = task_outcome(task, actor=actor)
        if isinstance(outcome, ProtocolError):
            raise outcome
        return outcome

    def final(done: Task) -> dict[str, Any]:
        outcome = task_outcome(done, actor=actor)
        if isinstance(outcome, ProtocolError):
            return jsonrpc.error(request_id, outcome)
        return jsonrpc.result(request_id, outcome)

    return Stream(
        legacy_streams.task_result_stream(
            request_id=request_id,
            session_id=call.session.pk,
            task_id=task.id,
            final=final,
            may_ask=call.may_ask,
        )
    )


def _encode_cursor(task: Task) -> str:
    return signing.dumps([task.created_at.isoformat(), task.id], salt=_CURSOR_SALT)


def _decode_cursor(cursor: Any) -> tuple[datetime, str]:
    try:
        created, task_id = signing.loads(cursor, salt=_CURSOR_SALT)
        return datetime.fromisoformat(created), str(task_id)
    except (signing.BadSignature, TypeError, ValueError):
        raise InvalidParams("Invalid cursor") from None


def list_tasks(call: Call) -> Reply:
    tasks = legacy_sessions.visible_tasks(call.caller, call.session).order_by("-created_at", "id")
    tasks = tasks.exclude(tool_name__in=authorization.denied_tools(call.caller))  # tasks of tools out of scope
    cursor = call.params.get("cursor")
    if cursor is not None:
        if not isinstance(cursor, str):
            raise InvalidParams("Invalid cursor")
        created, task_id = _decode_cursor(cursor)
        tasks = tasks.filter(created_at__lt=created) | tasks.filter(created_at=created, id__gt=task_id)
        tasks = tasks.order_by("-created_at", "id")
    page = list(tasks[: LIST_PAGE_SIZE + 1])
    result: dict[str, Any] = {"tasks": [task_object(t) for t in page[:LIST_PAGE_SIZE]]}
    if len(page) > LIST_PAGE_SIZE:
        result["nextCursor"] = _encode_cursor(page[LIST_PAGE_SIZE - 1])
    return result


def cancel_task(call: Call) -> Reply:
    """Cancel before answering; a task already finished cannot be (-32602)."""
    reason = "The task was cancelled by request."
    task = now(task_methods.cancel(SessionTasks(call), call.caller, call.params, reason=reason))
    if not task.is_terminal:
        task.refresh_from_db()
        if task.status == TaskStatus.CANCELLED:
            return task_object(task)
    raise InvalidParams(f"Cannot cancel task: already in terminal status '{task.status}'")
