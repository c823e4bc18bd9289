"""Reading a task for its owner, on a thread and on the loop: ``lookup`` (no write) and ``poll``
(``tasks/get``'s, which also marks a finished task's first outcome read), each one store step."""

from __future__ import annotations

import logging

from ..models import TERMINAL_STATUSES, Task
from .store import backend

#: Reads of finished tasks (the spec's "retrieval" audit), one line per read.
audit_logger = logging.getLogger("mcptasks.audit")

#: The fields ``task_lookup`` reads: those of a DetailedTask.
LOOKUP_FIELDS = (
    *("id", "owner", "tool_name", "era", "status", "status_message", "result", "error"),
    *("created_at", "updated_at", "ttl_ms", "poll_interval_ms", "outcome_read_at"),
)


def lookup(task_id: str, owner: str) -> Task | None:
    return backend().lookup(task_id, owner, LOOKUP_FIELDS)


def poll(task_id: str, owner: str, *, actor: str) -> Task | None:
    """``lookup``, marking a finished task's first outcome read by ``actor``; the caller logs the read."""
    return backend().poll(task_id, owner, LOOKUP_FIELDS, actor=actor)


# The awaited twins raise ``sql.NotOnLoop`` when Postgres fails on the loop.
async def alookup(task_id: str, owner: str) -> Task | None:
    return await backend().alookup(task_id, owner, LOOKUP_FIELDS)


async def apoll(task_id: str, owner: str, *, actor: str) -> Task | None:
    return await backend().apoll(task_id, owner, LOOKUP_FIELDS, actor=actor)


def log_outcome_read(task: Task, *, actor: str) -> None:
    """One line on ``mcptasks.audit`` for a read of a finished task's outcome."""
    if task.status not in TERMINAL_STATUSES:
        return
    extra = dict(
        task_id=task.id, kind="result_retrieved", status=task.status, tool=task.tool_name, owner=task.owner, actor=actor
    )
    audit_logger.info("task %s %s result retrieved by %s", task.id, task.status, actor, extra=extra)


def mark_outcome_read(task: Task, *, actor: str) -> bool:
    """Mark a finished task's first outcome read, once; whether this read was the first."""
    if task.status not in TERMINAL_STATUSES or task.outcome_read_at is not None:
        return False
    return backend().mark_outcome_read(task, LOOKUP_FIELDS, actor=actor)
