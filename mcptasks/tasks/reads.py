"""Reading a task for its owner: ``lookup`` (no write) and ``poll`` (the
read of ``tasks/get``, which also marks the first read of a finished task's
outcome), each on a thread and on the event loop (``alookup``, ``apoll``).

On Postgres each is one named statement (``task_lookup``, ``task_poll`` in
``queries.sql``); on other databases the ORM implementation beside it does
the same, and the loop forms are not available (``sql.NotOnLoop``). The first
read of a finished task's outcome has one writer per backend:
``mark_outcome_read`` (``task_poll`` on Postgres), and every read of one is
logged (``log_outcome_read``, by the caller that answers the read).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import TERMINAL_STATUSES, Task
from . import sql
from .events import EventKind, record_event

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


def _poll_params(task_id: str, owner: str, actor: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "owner": owner,
        "now": timezone.now(),
        "terminal": sql.strings(TERMINAL_STATUSES),
        "kind": EventKind.RESULT_RETRIEVED.value,
        "actor": actor,
    }


def _task(names: Sequence[str], row: Sequence[Any] | None) -> Task | None:
    if row is None:
        return None
    return Task.objects.from_row(names[: len(LOOKUP_FIELDS)], row[: len(LOOKUP_FIELDS)])


def lookup(task_id: str, owner: str) -> Task | None:
    """The owner's task with the fields of a DetailedTask, or ``None``."""
    if sql.single_statement():
        cursor = sql.execute("task_lookup", {"task_id": task_id, "owner": owner})
        return _task(sql.column_names(cursor), cursor.fetchone())
    return Task.objects.filter(pk=task_id, owner=owner).only(*LOOKUP_FIELDS).first()


def poll(task_id: str, owner: str, *, actor: str) -> Task | None:
    """``lookup``, and, for a finished task whose outcome nobody has read, the
    mark of that first read (``outcome_read_at``) and its ``result_retrieved``
    event by ``actor``: one statement on Postgres. (The audit line of each
    outcome read is the caller's to log once the read is answered:
    ``log_outcome_read``.)"""
    if sql.single_statement():
        cursor = sql.execute("task_poll", _poll_params(task_id, owner, actor))
        task = _task(sql.column_names(cursor), cursor.fetchone())
    else:
        task = lookup(task_id, owner)
        if task is not None:
            mark_outcome_read(task, actor=actor)
    return task


async def alookup(task_id: str, owner: str) -> Task | None:
    """``lookup`` on the event loop (Postgres only; ``NotOnLoop`` otherwise)."""
    if not sql.loop_available():
        raise sql.NotOnLoop("not Postgres")
    result = await sql.aexecute("task_lookup", {"task_id": task_id, "owner": owner})
    return _task(result.names, result.first())


async def apoll(task_id: str, owner: str, *, actor: str) -> Task | None:
    """``poll`` on the event loop (Postgres only; ``NotOnLoop`` otherwise)."""
    if not sql.loop_available():
        raise sql.NotOnLoop("not Postgres")
    result = await sql.aexecute("task_poll", _poll_params(task_id, owner, actor))
    return _task(result.names, result.first())


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
    if sql.single_statement():
        cursor = sql.execute("task_poll", _poll_params(task.id, task.owner, actor))
        row = cursor.fetchone()
        read = _task(sql.column_names(cursor), row)
        task.outcome_read_at = read.outcome_read_at if read is not None else task.outcome_read_at
        return bool(row is not None and row[-1])
    now = timezone.now()
    with transaction.atomic():
        first = Task.objects.filter(pk=task.id, status__in=TERMINAL_STATUSES, outcome_read_at__isnull=True).update(
            outcome_read_at=now
        )
        if first:
            record_event(task.id, EventKind.RESULT_RETRIEVED, actor, now=now, detail={"status": task.status})
    task.outcome_read_at = now
    return bool(first)
