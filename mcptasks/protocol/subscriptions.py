"""``subscriptions/listen`` (2026-07-28 + tasks extension): the filter checked
and acknowledged (:func:`listen`), then a long-lived SSE stream of
``notifications/tasks`` and list-changed notifications.

The stream is an async generator on the server's event loop: an open
subscription costs no thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from asgiref.sync import sync_to_async

from ..conf import settings
from ..errors import InvalidParams, missing_tasks_extension
from ..models import Task
from ..notify import fabric as notify
from ..notify.shutdown import shutdown_event
from . import authorization, limits
from .caller import Caller
from .jsonrpc import RequestId
from .shapes import change_stamp, detailed_task
from .streaming import Stream

META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


def _notification(method: str, params: dict[str, Any], subscription_id: RequestId) -> dict[str, Any]:
    meta = {**params.get("_meta", {}), META_SUBSCRIPTION_ID: subscription_id}
    return {"jsonrpc": "2.0", "method": method, "params": {**params, "_meta": meta}}


def _current_snapshots(task_ids: list[str]) -> list[dict[str, Any]]:
    tasks = {t.id: t for t in Task.objects.filter(pk__in=task_ids)}
    return [{"task": detailed_task(tasks[tid]), "at": change_stamp(tasks[tid])} for tid in task_ids if tid in tasks]


class TaskOrder:
    """Drops a change older than (or the same as) one already delivered: the
    changes of one task may reach us from several publishers."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def is_new(self, task_id: str, at: int) -> bool:
        if at <= self._last.get(task_id, -1):
            return False
        self._last[task_id] = at
        return True


async def listen_stream(
    subscription_id: RequestId,
    acknowledged: Mapping[str, Any],
    task_ids: list[str],
) -> AsyncIterator[dict[str, Any] | None]:
    groups = [notify.task_group(tid) for tid in task_ids]
    if acknowledged.get("toolsListChanged"):
        groups.append(notify.TOOLS_GROUP)
    if acknowledged.get("promptsListChanged"):
        groups.append(notify.PROMPTS_GROUP)
    order = TaskOrder()
    shutdown = shutdown_event()
    async with notify.Listener(groups) as listener:
        yield _notification(
            "notifications/subscriptions/acknowledged", {"notifications": dict(acknowledged)}, subscription_id
        )
        # Joined first, read second: no change can fall between the two.
        for snapshot in await sync_to_async(_current_snapshots)(task_ids):
            if order.is_new(snapshot["task"]["taskId"], snapshot["at"]):
                yield _notification("notifications/tasks", snapshot["task"], subscription_id)
        stopping = asyncio.ensure_future(shutdown.wait())
        try:
            while True:
                receiving = asyncio.ensure_future(listener.receive(settings.KEEPALIVE_SECONDS))
                done, _ = await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if stopping in done:
                    receiving.cancel()
                    # A graceful end: the response to the listen request itself.
                    yield {
                        "jsonrpc": "2.0",
                        "id": subscription_id,
                        "result": {"resultType": "complete", "_meta": {META_SUBSCRIPTION_ID: subscription_id}},
                    }
                    return
                message = receiving.result()
                if message is None:
                    yield None  # keep-alive
                    continue
                if "task_id" not in message:  # a list changed
                    yield _notification(message["list_method"], {}, subscription_id)
                    continue
                if order.is_new(message["task_id"], int(message.get("at", 0))):
                    yield _notification("notifications/tasks", message["task"], subscription_id)
        finally:
            stopping.cancel()


def listen(params: Mapping[str, Any], caller: Caller, tasks_enabled: bool, request_id: RequestId | None) -> Stream:
    """Acknowledge the filter, then stream changes. Task ids the caller does not
    own (or that do not exist) are left out of the acknowledgement: indistinguishable, like tasks/get."""
    limits.throttle("listen", caller.owner)
    wanted = params.get("notifications")
    if not isinstance(wanted, dict):
        raise InvalidParams('subscriptions/listen needs "notifications" (an object)')
    acknowledged: dict[str, Any] = {}
    task_ids: list[str] = []
    if "taskIds" in wanted:
        requested = wanted["taskIds"]
        if not isinstance(requested, list) or not all(isinstance(t, str) for t in requested):
            raise InvalidParams('"notifications.taskIds" must be an array of strings')
        if not tasks_enabled:
            raise missing_tasks_extension()
        if len(requested) > settings.MAX_LISTEN_TASKS:
            raise InvalidParams(f"At most {settings.MAX_LISTEN_TASKS} task ids per subscription")
        requested = list(dict.fromkeys(requested))
        owned_tasks = list(Task.objects.filter(pk__in=requested, owner=caller.owner).only("id", "tool_name"))
        for task in owned_tasks:
            authorization.require_task(caller, task)
        owned = {task.id for task in owned_tasks}
        task_ids = [tid for tid in requested if tid in owned]
        acknowledged["taskIds"] = task_ids
    for flag in ("toolsListChanged", "promptsListChanged"):
        if wanted.get(flag) is True:
            acknowledged[flag] = True
    assert request_id is not None  # a request: notifications never reach a handler
    return Stream(listen_stream(request_id, acknowledged, task_ids))
