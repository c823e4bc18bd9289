"""Connects committed lifecycle changes, and registry changes, to the
notification fabric. Connected by the app config when a channel layer is
configured (otherwise nobody could listen, and snapshots would be wasted).
A task's change is published as the app's own (``events.add_publisher``):
it reads no ORM, so a change on the event loop is published there."""

from __future__ import annotations

from typing import Any

from .. import signals
from ..models import Task
from ..notify import fabric as notify
from ..tasks import events
from .shapes import change_stamp, detailed_task


def publish_task_change(
    *, task_id: str, task: Task | None = None, pending_inputs: Any = None, kind: str = "", **_: Any
) -> None:
    if task is None:  # deleted in the same transaction; nothing to show
        return
    if kind == "created":
        # Nobody can listen yet: streams name the tasks they follow by id, and
        # the id is unknown outside this commit until the creator answers.
        # Each later change is published; a stream opened now starts from a
        # snapshot read after it joined the task's group.
        return
    if not notify.is_followed(notify.task_group(task_id)):  # checked after commit: see notify.followers
        return
    notify.publish_task(
        task_id,
        {
            "kind": kind,
            "task": detailed_task(task, pending_inputs),
            "era": task.era,
            "at": change_stamp(task),
        },
    )


def publish_registry_change(*, kind: str, **_: Any) -> None:
    group = {"tools": notify.TOOLS_GROUP, "prompts": notify.PROMPTS_GROUP}.get(kind)
    if group:
        notify.publish_list_changed(group)


def connect() -> None:
    events.add_publisher(publish_task_change)
    signals.registry_changed.connect(publish_registry_change, dispatch_uid="mcptasks.publish_registry_change")
