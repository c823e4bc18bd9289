"""The task as both protocol eras and the notification fabric show it.

One serializer (``detailed_task``), one timestamp format (``iso``) and one
change stamp (``change_stamp``): what ``tasks/get``, ``notifications/tasks``,
the management command and the 2025-era task objects all build on.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..errors import INTERNAL_ERROR
from ..models import Task, TaskStatus
from ..tasks.inputs import pending_inputs


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def change_stamp(task: Task) -> int:
    """Microseconds since the epoch of the task's last change: orders the
    notifications of one task."""
    return int(task.updated_at.timestamp() * 1_000_000)


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


def detailed_task(task: Task, pending: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The DetailedTask for ``task``: what tasks/get and notifications carry.
    ``pending`` (the outstanding input requests) is read when not given."""
    data = task_fields(task)
    if task.status == TaskStatus.INPUT_REQUIRED:
        data["inputRequests"] = dict(pending) if pending is not None else pending_inputs(task.id)
    elif task.status == TaskStatus.COMPLETED:
        data["result"] = {"resultType": "complete", **(task.result or {})}
    elif task.status == TaskStatus.FAILED:
        data["error"] = task.error or {"code": INTERNAL_ERROR, "message": task.status_message or "Task failed"}
    return data
