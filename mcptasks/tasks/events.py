"""What every change leaves behind: its ``TaskEvent`` row, and once committed
a ``signals.task_changed`` and a structured log line (on the ``mcptasks.lifecycle`` logger).
Actors are named here too."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import transaction

from .. import signals
from ..models import Task, TaskEvent, TaskStatus
from .inputs import pending_inputs

logger = logging.getLogger("mcptasks.lifecycle")


SYSTEM = "system"


class EventKind(StrEnum):
    """What a ``TaskEvent`` row records; the raw statements use these too."""

    CREATED = "created"
    TRANSITION = "transition"
    RUN_STARTED = "run_started"
    REDISPATCHED = "redispatched"
    INPUT = "input"
    EXPIRED = "expired"
    RETRIED = "retried"
    RETRY_OF = "retry_of"
    RESULT_RETRIEVED = "result_retrieved"
    #: The tool raised an exception it retries on: another attempt is due
    #: later (a tool retry; ``retried`` is an operator's retry of a task).
    TOOL_RETRY = "tool_retry"


#: A change that is signalled but not recorded as an event.
STATUS_MESSAGE = "status_message"


def client_actor(owner: str) -> str:
    return f"client:{owner}"


def operator_actor(username: str) -> str:
    return f"operator:{username}"


def worker_actor(name: str) -> str:
    return f"worker:{name}"


def _snapshot(task_id: str) -> tuple[Task | None, dict[str, Any] | None]:
    """The task as this change leaves it (read inside the transaction), for
    listeners that must see every transition; skipped when nobody listens."""
    if not signals.task_changed.has_listeners(Task):
        return None, None
    task = Task.objects.filter(pk=task_id).first()
    pending = None
    if task is not None and task.status == TaskStatus.INPUT_REQUIRED:
        pending = pending_inputs(task_id)
    return task, pending


def announce(
    task_id: str,
    from_status: str,
    to_status: str,
    actor: str,
    kind: str,
    *,
    task: Task | None = None,
    progress: Mapping[str, Any] | None = None,
) -> None:
    """Log and signal the change once it is committed (never before: a
    listener must not see what a rollback undoes). ``task``, when the caller
    has the row as the change left it, saves the snapshot query. ``progress``:
    a status message's numbers, when its tool gave them."""
    if task is not None:
        pending: dict[str, Any] | None = {}
    else:
        task, pending = _snapshot(task_id)
    transaction.on_commit(lambda: _send(task_id, from_status, to_status, actor, kind, task, pending, progress))


def announce_committed(
    task: Task,
    from_status: str,
    actor: str,
    kind: str,
    *,
    pending: dict[str, Any] | None = None,
    progress: Mapping[str, Any] | None = None,
) -> None:
    """``announce`` for a change already committed (a statement in
    autocommit on the event loop), with the row as it left it and, where
    it waits, its pending questions."""
    _send(task.id, from_status, task.status, actor, kind, task, pending if pending is not None else {}, progress)


def _send(
    task_id: str,
    from_status: str,
    to_status: str,
    actor: str,
    kind: str,
    task: Task | None,
    pending: Any,
    progress: Mapping[str, Any] | None = None,
) -> None:
    kind = kind.value if isinstance(kind, EventKind) else kind  # listeners get plain strings
    logger.info(
        "task %s %s %s -> %s by %s",
        task_id,
        kind,
        from_status or "-",
        to_status,
        actor,
        extra={"task_id": task_id, "kind": kind, "from_status": from_status, "to_status": to_status, "actor": actor},
    )
    signals.task_changed.send(
        sender=Task,
        task_id=task_id,
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        kind=kind,
        task=task,
        pending_inputs=pending,
        progress=progress,
    )


def record_event(
    task_id: str,
    kind: str,
    actor: str,
    *,
    now: datetime,
    from_status: str = "",
    to_status: str = "",
    detail: Mapping[str, Any] | None = None,
) -> None:
    TaskEvent.objects.create(
        task_id=task_id,
        at=now,
        kind=kind,
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        detail=dict(detail or {}),
    )
