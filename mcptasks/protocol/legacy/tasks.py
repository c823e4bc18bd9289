"""The 2025-11-25 experimental task methods: ``tasks/get``, ``tasks/result``,
``tasks/list`` and ``tasks/cancel``, on the tasks a session may see."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core import signing

from ...errors import (
    INTERNAL_ERROR,
    InvalidParams,
    ProtocolError,
    TaskNotFound,
)
from ...models import Task, TaskStatus
from ...tasks import lifecycle
from .. import authorization, jsonrpc, limits
from ..streaming import Stream
from . import sessions as legacy_sessions
from . import streams as legacy_streams
from .calls import Call, Reply
from .sessions import related, task_object

#: Tasks per ``tasks/list`` page.
LIST_PAGE_SIZE = 50
_CURSOR_SALT = "mcptasks.legacy.tasks_list"


def _task_for(call: Call) -> Task:
    task_id = call.params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidParams('"taskId" (a string) is required')
    if not limits.storable_id(task_id, 64):
        raise TaskNotFound()  # no stored id is like it: the same answer as any unknown id
    task = legacy_sessions.visible_tasks(call.caller, call.session).filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound()
    authorization.require_task(call.caller, task)
    return task


def get_task(call: Call) -> Reply:
    task = _task_for(call)
    limits.throttle_poll(call.caller.owner, task.id, task.poll_interval_ms)
    return task_object(task)


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
    task = _task_for(call)
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
    task = _task_for(call)
    limits.throttle("update", call.caller.owner)
    if not task.is_terminal:
        actor = lifecycle.client_actor(call.caller.owner)
        lifecycle.cancel(task.id, actor=actor, reason="The task was cancelled by request.")
        task.refresh_from_db()
        if task.status == TaskStatus.CANCELLED:
            return task_object(task)
    raise InvalidParams(f"Cannot cancel task: already in terminal status '{task.status}'")
