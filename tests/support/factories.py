"""Building tasks in given states through the real lifecycle functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from mcptasks.models import TERMINAL_STATUSES, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle

WORKER = "test-host:1:worker"


def elicit(message: str = "Sure?", prop: str = "confirm") -> dict[str, Any]:
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {"type": "object", "properties": {prop: {"type": "boolean"}}},
        },
    }


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


def make_task(owner: str = "alice", tool: str = "slow_compute", arguments: Mapping[str, Any] | None = None, **kw: Any):
    return lifecycle.create_task(owner=owner, tool_name=tool, arguments=dict(arguments or {}), enqueue=False, **kw)


def running_task(worker: str = WORKER, **kw: Any) -> Task:
    """A ``working`` task whose run ``worker`` holds the lease of."""
    task = make_task(**kw)
    claimed = lifecycle.claim(task.id, worker=worker)
    assert claimed is not None
    return claimed


def waiting_task(keys: Iterable[str] = ("first", "second"), worker: str = WORKER, **kw: Any) -> Task:
    """An ``input_required`` task with one pending elicitation per key."""
    task = running_task(worker=worker, **kw)
    assert lifecycle.request_input(task.id, {key: elicit(key) for key in keys}, worker=worker)
    return Task.objects.get(pk=task.id)


def completed_task(**kw: Any) -> Task:
    task = running_task(**kw)
    assert lifecycle.complete(task.id, {"content": [], "isError": False}, worker=WORKER)
    return Task.objects.get(pk=task.id)


def failed_task(**kw: Any) -> Task:
    task = running_task(**kw)
    assert lifecycle.fail(task.id, {"code": -32603, "message": "boom"}, actor="system")
    return Task.objects.get(pk=task.id)


def cancelled_task(**kw: Any) -> Task:
    task = running_task(**kw)
    assert lifecycle.cancel(task.id, actor="client:alice")
    return Task.objects.get(pk=task.id)


def transitions(task_id: str) -> list[tuple[str, str]]:
    """Every status change recorded for the task, in order (creation included)."""
    rows = TaskEvent.objects.filter(task_id=task_id).exclude(to_status="").order_by("at", "id")
    return [(e.from_status, e.to_status) for e in rows]


def terminal_transitions(task_id: str) -> list[tuple[str, str]]:
    return [t for t in transitions(task_id) if t[1] in TERMINAL_STATUSES]


def bulk_expired_tasks(count: int) -> None:
    """``count`` completed tasks ``bulk-1`` .. ``bulk-<count>`` of owner ``bulk``,
    expired an hour ago (``bulk-1`` last, a millisecond apart), each with its
    creation event (actor ``client:bulk``) and its completion (``system``).

    On Postgres in two statements; elsewhere (SQLite has no generate_series)
    the same rows through the ORM."""
    if connection.vendor != "postgresql":
        _bulk_create_expired_tasks(count)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO mcptasks_task (id, owner, tool_name, arguments, era, client_capabilities, status,
                status_message, result, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms,
                attempts, lease_owner, cancelled_by)
            SELECT 'bulk-' || g, 'bulk', 'slow_compute', '{}', '2026-07-28', '{}', 'completed', '',
                '{"content": [], "isError": false}', now() - interval '2 hours', now() - interval '2 hours',
                3600000, now() - interval '1 hour' - (g || ' milliseconds')::interval, 1000, 1, '', ''
            FROM generate_series(1, %s) AS g
            """,
            [count],
        )
        cursor.execute(
            """
            INSERT INTO mcptasks_taskevent (task_id, at, kind, from_status, to_status, actor, detail)
            SELECT t.id, t.created_at, k.kind, k.f, k.t, k.actor, '{}'
            FROM mcptasks_task t,
                 (VALUES ('created', '', 'working', 'client:bulk'),
                         ('transition', 'working', 'completed', 'system')) AS k(kind, f, t, actor)
            WHERE t.owner = 'bulk'
            """
        )


#: The events ``bulk_expired_tasks`` gives each task: kind, from, to, actor.
_BULK_EVENTS = (("created", "", "working", "client:bulk"), ("transition", "working", "completed", "system"))


def _bulk_create_expired_tasks(count: int) -> None:
    """What ``bulk_expired_tasks``'s statements insert, row for row."""
    now = timezone.now()
    made = now - timedelta(hours=2)
    Task.objects.bulk_create(
        (
            Task(
                id=f"bulk-{g}",
                owner="bulk",
                tool_name="slow_compute",
                status=TaskStatus.COMPLETED,
                result={"content": [], "isError": False},
                created_at=made,
                updated_at=made,
                ttl_ms=3_600_000,
                expires_at=now - timedelta(hours=1, milliseconds=g),
                attempts=1,
            )
            for g in range(1, count + 1)
        ),
        batch_size=2_000,
    )
    TaskEvent.objects.bulk_create(
        (
            TaskEvent(task_id=f"bulk-{g}", at=made, kind=kind, from_status=source, to_status=target, actor=actor)
            for g in range(1, count + 1)
            for kind, source, target, actor in _BULK_EVENTS
        ),
        batch_size=2_000,
    )
