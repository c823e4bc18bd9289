"""Creating a task, within the per-owner quota of active tasks.

The Postgres path inserts the task and its ``created`` event in one
statement (``_insert_created_sql``); the ORM path (``create_task``'s
fallback) does the same in a transaction.
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
from ..models import ACTIVE_STATUSES, Era, InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from . import sql
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
    )
    actor = client_actor(owner)
    detail = {"tool": tool_name, "era": era}
    if not (sql.single_statement() and not answered and _insert_created_sql(task, actor, detail)):
        with transaction.atomic():
            _check_active_quota(owner)
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
    if enqueue:
        enqueue_after_commit(task.id)
    return task


class TooManyActiveTasks(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"Too many active tasks: at most {limit} may be working or waiting at once")
        self.limit = limit


#: How far below the quota an owner's count must be for a creation to share
#: the per-owner lock instead of taking it alone. Sharers run side by side, so
#: the quota stays exact while fewer than this many creations of one owner are
#: in flight at once (a web process runs at most ``WEB_THREADS``).
QUOTA_LOCK_MARGIN = 256


def _check_active_quota(owner: str) -> None:
    """``MAX_ACTIVE_TASKS_PER_OWNER``, exact under concurrency.

    On Postgres every creation holds a transaction-scoped advisory lock on
    its owner, in one mode only (never upgraded, so never a deadlock). Far
    below the limit it is shared, so one owner's creations do not wait for
    each other's commits. Near it, the lock is exclusive, which waits for
    every creation in flight to commit, and the count is taken again under it.
    """
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    if limit is None:
        return
    if connection.vendor == "postgresql":
        shared = _far_below_quota(owner, limit)
        function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {function}(hashtextextended(%s, 0))", [_quota_lock_key(owner)])
        if shared:
            return
    if Task.objects.filter(owner=owner, status__in=ACTIVE_STATUSES).count() >= limit:
        raise TooManyActiveTasks(limit)


def _far_below_quota(owner: str, limit: int) -> bool:
    """Whether ``owner`` is far enough below ``limit`` for a creation to take
    the quota lock shared (Postgres), from a count taken without the lock."""
    if limit <= QUOTA_LOCK_MARGIN:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {sql.tables()['task']} WHERE owner = %s AND status = ANY(%s)",
            [owner, list(ACTIVE_STATUSES)],
        )
        (active,) = cursor.fetchone()
    return active < limit - QUOTA_LOCK_MARGIN


def _quota_lock_key(owner: str) -> str:
    return f"mcptasks:{owner}"


def _insert_created_sql(task: Task, actor: str, detail: Mapping[str, Any]) -> bool:
    """Insert a new task and its ``created`` event in one statement (its own
    transaction, or the caller's). Returns ``False``, having done nothing,
    when the owner is near its quota: the caller then takes the exclusive
    path of ``_check_active_quota``.

    Far below the quota the statement takes the owner's lock shared, as
    ``_check_active_quota`` does, and holds it until it commits, so an
    exclusive checker still waits for this creation before it counts.
    """
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    params: list[Any] = []
    lock = False
    if limit is not None:
        if not _far_below_quota(task.owner, limit):
            return False
        lock = True
        params.append(_quota_lock_key(task.owner))
    fields = Task._meta.concrete_fields
    params += [f.get_db_prep_save(f.pre_save(task, add=True), connection) for f in fields]
    statement = _created_sql(with_quota_lock=lock, alias=connection.alias)
    params += [task.created_at, task.status, actor, sql.db_value(TaskEvent, "detail", dict(detail))]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
    task._state.adding = False
    task._state.db = connection.alias
    return True


@functools.cache
def _created_sql(*, with_quota_lock: bool, alias: str) -> str:
    """The task's INSERT and its ``created`` event, as one statement;
    optionally taking the owner's quota lock shared first. Cached per
    database alias: quoting is the connection's."""
    t = sql.tables()
    names, columns = sql.task_columns()
    placeholders = ", ".join(["%s"] * len(names))
    if with_quota_lock:
        head = "WITH quota AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))), "
        source = f"SELECT {placeholders} FROM quota"
    else:
        head, source = "WITH ", f"VALUES ({placeholders})"
    return (
        f"{head}created AS (INSERT INTO {t['task']} ({columns}) {source} RETURNING id) "
        f"INSERT INTO {t['event']} ({sql.event_columns()}) "
        f"SELECT id, %s, '{EventKind.CREATED}', '', %s, %s, %s FROM created"
    )
