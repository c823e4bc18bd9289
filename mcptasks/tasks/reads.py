"""Reading a task for its owner: ``lookup`` (no write) and ``poll`` (the
read of ``tasks/get``, which also marks the first read of a finished task's
outcome), each on a thread and on the event loop (``alookup``, ``apoll``).

On Postgres each is one named statement (``task_lookup``, ``task_poll`` in
``queries.sql``); on other databases the ORM implementation beside it does
the same, and the loop forms are not available (``sql.NotOnLoop``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from ..models import TERMINAL_STATUSES, Task
from . import sql
from .events import EventKind
from .operator import mark_outcome_read

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
    ``operator.log_outcome_read``.)"""
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
