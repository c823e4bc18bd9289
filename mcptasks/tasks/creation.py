"""Creating a task, within the per-owner quota of active tasks.

The Postgres path counts the task in its owner's quota (``quota``), inserts
it and its ``created`` event in one statement (``_insert_created_sql``); the
ORM path (``create_task``'s fallback) does the same in a transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from .. import signals
from ..conf import settings
from ..models import Era, InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from ..telemetry import metrics, tracing
from . import quota, sql
from .dispatch import enqueue_after_commit
from .events import EventKind, announce, client_actor, record_event


def clamp_ttl(requested_ms: int | None, tool_default_ms: int | None = None) -> int:
    """The TTL a new task gets: the request's (or the tool's, or the site's)
    default, never above ``MAX_TTL_MS``."""
    ttl = requested_ms if requested_ms is not None else tool_default_ms
    if ttl is None:
        ttl = settings.DEFAULT_TTL_MS
    return max(0, min(int(ttl), settings.MAX_TTL_MS))


@dataclass(frozen=True)
class Answer:
    """An input request answered before the task existed (MRTR phase)."""

    method: str
    params: dict[str, Any]
    response: dict[str, Any]


def create_task(
    *,
    owner: str,
    tool_name: str,
    arguments: dict[str, Any],
    era: str = Era.MODERN,
    client_capabilities: dict[str, Any] | None = None,
    ttl_ms: int | None = None,
    poll_interval_ms: int | None = None,
    answered: Mapping[str, Answer] | None = None,
    enqueue: bool = True,
) -> Task:
    """Insert a ``working`` task and enqueue its run after commit.

    Runs in its own transaction (or the caller's): the caller may hand out the
    id as soon as this returns outside any enclosing atomic block.
    """
    now = timezone.now()
    ttl = clamp_ttl(ttl_ms)
    task = Task(
        owner=owner,
        tool_name=tool_name,
        arguments=arguments,
        era=era,
        client_capabilities=client_capabilities or {},
        status=TaskStatus.WORKING,
        created_at=now,
        updated_at=now,
        ttl_ms=ttl,
        expires_at=now + timedelta(milliseconds=ttl),
        poll_interval_ms=poll_interval_ms or settings.POLL_INTERVAL_MS,
        dispatched_at=now if enqueue else None,
        trace_context=tracing.carrier() or None,
    )
    actor = client_actor(owner)
    detail = {"tool": tool_name, "era": era}
    one_statement = sql.single_statement() and not answered
    if not (one_statement and _insert_created_sql(task, actor, detail)):
        with transaction.atomic():
            # The one statement declines only near the limit.
            quota.take_place(owner, near_the_limit=one_statement)
            task.save(force_insert=True)
            if answered:
                InputRequest.objects.bulk_create(
                    InputRequest(
                        task=task,
                        key=key,
                        method=a.method,
                        params=a.params,
                        response=a.response,
                        state=InputRequestState.ANSWERED,
                        answered_at=now,
                    )
                    for key, a in answered.items()
                )
            record_event(task.id, EventKind.CREATED, actor, now=now, to_status=TaskStatus.WORKING, detail=detail)
    transaction.on_commit(lambda: signals.task_created.send(sender=Task, task=task))
    announce(task.id, "", TaskStatus.WORKING, actor, EventKind.CREATED, task=task)
    metrics.task_created(tool_name)
    if enqueue:
        enqueue_after_commit(task.id)
    return task


def _insert_created_sql(task: Task, actor: str, detail: Mapping[str, Any]) -> bool:
    """Count the task in its owner's quota, insert it and its ``created``
    event, in one statement (its own transaction, or the caller's). Returns
    ``False``, having done nothing, when the owner is near its quota: the
    caller then takes the exclusive path of ``quota.take_place``.

    Far below the quota the statement takes the owner's lock shared, as
    ``take_place`` does, and holds it until it commits, so an exclusive
    checker still waits for this creation before it reads the count.
    """
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    params: list[Any] = []
    if limit is not None:
        if limit <= quota.QUOTA_LOCK_MARGIN:
            return False
        params += [task.owner, task.owner, quota.quota_lock_key(task.owner), limit - quota.QUOTA_LOCK_MARGIN]
    else:
        params.append(task.owner)
    fields = Task._meta.concrete_fields
    params += [f.get_db_prep_save(f.pre_save(task, add=True), connection) for f in fields]
    params += [task.created_at, task.status, actor, sql.db_value(TaskEvent, "detail", dict(detail))]
    with connection.cursor() as cursor:
        cursor.execute(_created_sql(with_quota=limit is not None, alias=connection.alias), params)
        if cursor.rowcount != 1:
            return False
    task._state.adding = False
    task._state.db = connection.alias
    return True


@functools.cache
def _created_sql(*, with_quota: bool, alias: str) -> str:
    """The owner's count, the task's INSERT and its ``created`` event, as one
    statement. With the quota, only while the count is far below it, and
    under the owner's quota lock taken shared. Cached per database alias:
    quoting is the connection's."""
    t = sql.tables()
    names, columns = sql.task_columns()
    placeholders = ", ".join(["%s"] * len(names))
    if with_quota:
        gate = (
            f"total AS (SELECT coalesce(sum(active), 0) AS n FROM {t['count']} WHERE owner = %s), "
            "gate AS MATERIALIZED (SELECT %s::varchar AS owner, pg_advisory_xact_lock_shared(hashtextextended(%s, 0))"
            " FROM total WHERE n < %s)"
        )
    else:
        gate = "gate AS (SELECT %s::varchar AS owner)"
    return (
        f"WITH {gate}, {quota.slot_ctes('gate', 1, 'counted')}, "
        f"created AS (INSERT INTO {t['task']} ({columns}) SELECT {placeholders} FROM counted RETURNING id) "
        f"INSERT INTO {t['event']} ({sql.event_columns()}) "
        f"SELECT id, %s, '{EventKind.CREATED}', '', %s, %s, %s FROM created"
    )
