"""Reading a task for its owner: ``lookup`` (no write) and ``poll`` (the
read of ``tasks/get``, which also marks the first read of a finished task's
outcome), each on a thread and on the event loop (``alookup``, ``apoll``).

The process's store (``store.backend()``) reads: on Postgres one named
statement each (``task_lookup``, ``task_poll`` in ``queries.sql``), the loop
forms on the loop's own connections; elsewhere the ORM, the loop forms
awaited on a thread. The first read of a finished task's outcome has one
writer per backend: ``mark_outcome_read`` (``task_poll`` on Postgres), and
every read of one is logged (``log_outcome_read``, by the caller that
answers the read).
"""

from __future__ import annotations

import logging

from ..models import TERMINAL_STATUSES, Task
from .store import backend

#: Reads of finished tasks (the spec's "retrieval" audit), one line per read.
audit_logger = logging.getLogger("mcptasks.audit")

#: The fields ``task_lookup`` reads: those of a DetailedTask.
LOOKUP_FIELDS = (
    "id",
    "owner",
    "tool_name",
    "era",
    "status",
    "status_message",
    "result",
    "error",
    "created_at",
    "updated_at",
    "ttl_ms",
    "poll_interval_ms",
    "outcome_read_at",
)


def lookup(task_id: str, owner: str) -> Task | None:
    """The owner's task with the fields of a DetailedTask, or ``None``."""
    return backend().lookup(task_id, owner, LOOKUP_FIELDS)


def poll(task_id: str, owner: str, *, actor: str) -> Task | None:
    """``lookup``, and, for a finished task whose outcome nobody has read, the
    mark of that first read (``outcome_read_at``) and its ``result_retrieved``
    event by ``actor``: one statement on Postgres. (The audit line of each
    outcome read is the caller's to log once the read is answered:
    ``log_outcome_read``.)"""
    return backend().poll(task_id, owner, LOOKUP_FIELDS, actor=actor)


async def alookup(task_id: str, owner: str) -> Task | None:
    """``lookup``, awaited (``sql.NotOnLoop`` when Postgres fails on the loop)."""
    return await backend().alookup(task_id, owner, LOOKUP_FIELDS)


async def apoll(task_id: str, owner: str, *, actor: str) -> Task | None:
    """``poll``, awaited (``sql.NotOnLoop`` when Postgres fails on the loop)."""
    return await backend().apoll(task_id, owner, LOOKUP_FIELDS, actor=actor)


def log_outcome_read(task: Task, *, actor: str) -> None:
    """One line on ``mcptasks.audit`` for a read of a finished task's outcome."""
    if task.status not in TERMINAL_STATUSES:
        return
    audit_logger.info(
        "task %s %s result retrieved by %s",
        task.id,
        task.status,
        actor,
        extra={
            "task_id": task.id,
            "kind": "result_retrieved",
            "status": task.status,
            "tool": task.tool_name,
            "owner": task.owner,
            "actor": actor,
        },
    )


def mark_outcome_read(task: Task, *, actor: str) -> bool:
    """Mark the first read of a finished task's outcome (``outcome_read_at``)
    with its ``result_retrieved`` event, once: ``task_poll`` on Postgres,
    its ORM twin elsewhere. Returns whether this read was the first."""
    if task.status not in TERMINAL_STATUSES or task.outcome_read_at is not None:
        return False
    return backend().mark_outcome_read(task, LOOKUP_FIELDS, actor=actor)
