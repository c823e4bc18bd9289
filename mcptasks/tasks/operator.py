"""Operators and audit: retrying a failed or cancelled task, and the audit
of reads of a finished task's outcome (``mcptasks.audit``)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ..models import Task, TaskEvent, TaskStatus
from ..tools.registry import registry
from .creation import create_task
from .events import EventKind, logger, record_event
from .reads import audit_logger, log_outcome_read, mark_outcome_read

__all__ = ["RETRYABLE_STATUSES", "audit_logger", "note_result_retrieved", "retry", "retry_refusal"]


RETRYABLE_STATUSES = (TaskStatus.FAILED, TaskStatus.CANCELLED)


def retry_refusal(task: Task) -> str | None:
    """Why ``task`` may not be retried, or ``None`` when it may.

    A retry never touches the old row (terminal is final): it starts a new
    task with the same tool, arguments and owner. That is safe only when the
    work cannot end up done twice: the old task ended without doing it
    (``failed`` or ``cancelled``; a ``completed`` task did its work), and the
    tool declares that running it again is harmless (MCP tool annotations
    ``readOnlyHint`` or ``idempotentHint``). A tool run may have been cut off
    half way; only such a tool can be started over blindly.
    """
    if task.status not in RETRYABLE_STATUSES:
        return f"it is {task.status}"
    tool = registry.get(task.tool_name)
    if tool is None:
        return f"tool {task.tool_name!r} is no longer offered"
    hints = tool.annotations or {}
    if not (hints.get("readOnlyHint") or hints.get("idempotentHint")):
        return f"tool {task.tool_name!r} is not marked read-only or idempotent"
    return None


def retry(task_id: str, *, actor: str) -> Task | None:
    """Start a new task that repeats a failed or cancelled one.

    Returns the new task, or ``None`` when the old one may not be retried
    (see ``retry_refusal``) or was retried already: each task is retried at
    most once, so a double click starts one run. The old task gets a
    ``retried`` event naming the new id, the new one a ``retry_of`` event
    naming the old; both by ``actor``. The new task belongs to the old one's
    owner and is enqueued after commit.
    """
    with transaction.atomic():
        old = Task.objects.select_for_update().filter(pk=task_id).first()
        if old is None or retry_refusal(old) is not None:
            return None
        if TaskEvent.objects.filter(task_id=task_id, kind=EventKind.RETRIED).exists():
            return None
        new = create_task(
            owner=old.owner,
            tool_name=old.tool_name,
            arguments=old.arguments,
            era=old.era,
            client_capabilities=old.client_capabilities,
            ttl_ms=old.ttl_ms,
            poll_interval_ms=old.poll_interval_ms,
        )
        now = timezone.now()
        record_event(old.id, EventKind.RETRIED, actor, now=now, detail={"new_task_id": new.id})
        record_event(new.id, EventKind.RETRY_OF, actor, now=now, detail={"task_id": old.id})
        transaction.on_commit(
            lambda: logger.info(
                "task %s retried as %s by %s",
                old.id,
                new.id,
                actor,
                extra={"task_id": old.id, "kind": "retried", "new_task_id": new.id, "actor": actor},
            )
        )
    return new


def note_result_retrieved(task: Task, *, actor: str) -> bool:
    """Audit a read of a finished task's outcome (its result or error).

    Every such read is logged on ``mcptasks.audit``; the first is also
    recorded as a ``result_retrieved`` event, guarded by the task's
    ``outcome_read_at`` (set once). Reads of unfinished tasks (the polling hot
    path) cost nothing, and later reads of a finished one cost nothing either:
    the row read for the answer carries the mark. Returns whether an event
    was written. (``reads.poll`` marks as it reads the task; its caller logs.)
    """
    log_outcome_read(task, actor=actor)
    return mark_outcome_read(task, actor=actor)
