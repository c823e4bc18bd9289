"""Creating a task, within the per-owner quota of active tasks.

The Postgres path counts the task in its owner's quota (``quota``), inserts
it and its ``created`` event in one statement (``_insert_created_sql``); the
ORM path (``create_task``'s fallback) does the same in a transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, connections, models, transaction
from django.utils import timezone

from ..conf import settings
from ..models import Era, InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from ..telemetry import metrics, tracing
from . import dispatch, quota, sql
from .dispatch import enqueue_after_commit
from .events import EventKind, aannounce_created, announce, client_actor, record_event, send_created


def clamp_ttl(requested_ms: int | None, tool_default_ms: int | None = None) -> int:
    """The TTL a new task gets: the request's (or the tool's, or the site's)
    default, never above ``MAX_TTL_MS``."""
    ttl = requested_ms if requested_ms is not None else tool_default_ms
    if ttl is None:
        ttl = settings.DEFAULT_TTL_MS
    return max(0, min(int(ttl), int(settings.MAX_TTL_MS)))


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
    task, actor, detail = _new_task(
        owner, tool_name, arguments, era, client_capabilities, ttl_ms, poll_interval_ms, enqueue=enqueue
    )
    now = task.created_at
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
    transaction.on_commit(lambda: send_created(task))
    announce(task.id, "", TaskStatus.WORKING, actor, EventKind.CREATED, task=task)
    metrics.task_created(tool_name)
    if enqueue:
        enqueue_after_commit(task.id)
    return task


def _new_task(
    owner: str,
    tool_name: str,
    arguments: dict[str, Any],
    era: str,
    client_capabilities: dict[str, Any] | None,
    ttl_ms: int | None,
    poll_interval_ms: int | None,
    *,
    enqueue: bool,
) -> tuple[Task, str, dict[str, Any]]:
    """A new ``working`` task (not saved), its creator and its event's detail."""
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
    return task, client_actor(owner), {"tool": tool_name, "era": era}


async def acreate_task(
    *,
    owner: str,
    tool_name: str,
    arguments: dict[str, Any],
    client_capabilities: dict[str, Any] | None = None,
    ttl_ms: int | None = None,
    poll_interval_ms: int | None = None,
) -> Task | None:
    """``create_task`` of a modern-era task on the event loop: the same
    statement, in autocommit, then (committed) the same signals, then the
    run's publish through ``dispatch.loop_sender``. ``None``, having done
    nothing, when the statement declines near the owner's quota: the caller
    then takes ``create_task`` on a thread. Only where ``sql.loop_available``
    and a loop sender is installed."""
    send = dispatch.loop_sender()
    if send is None:
        raise RuntimeError("no runtime installed that sends runs from the event loop")
    task, actor, detail = _new_task(
        owner, tool_name, arguments, Era.MODERN, client_capabilities, ttl_ms, poll_interval_ms, enqueue=True
    )
    named = _created_statement(task, actor, detail)
    if named is None or (await sql.aexecute(*named)).rowcount != 1:
        return None
    task._state.adding = False
    task._state.db = Task.objects.db
    await aannounce_created(task, actor)
    metrics.task_created(tool_name, committed=True)
    await send(task.id)
    return task


_COLUMNS = [field.attname for field in Task._meta.concrete_fields]
#: The columns whose values Django adapts for the driver (JSON wrapped,
#: integers typed by their column); psycopg sends the rest as they are.
_ADAPTED_FIELDS = [f for f in Task._meta.concrete_fields if isinstance(f, models.JSONField | models.IntegerField)]


def column_params(task: Task) -> dict[str, Any]:
    """A new task's columns as a statement's parameters: what the ORM would
    save (``tests/test_sql_home.py`` holds the two equal), with
    ``get_db_prep_save`` called only where it changes the value, which saves
    most of its cost on every creation."""
    params = {name: getattr(task, name) for name in _COLUMNS}
    db = connections[Task.objects.db]
    for field in _ADAPTED_FIELDS:
        params[field.attname] = field.get_db_prep_save(params[field.attname], db)
    return params


def _created_statement(task: Task, actor: str, detail: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The creation statement and its parameters, or ``None`` when the
    owner's quota is too small for a creation to share its lock."""
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    params = column_params(task)
    params.update(kind=EventKind.CREATED.value, actor=actor, detail=sql.db_value(TaskEvent, "detail", dict(detail)))
    if limit is None:
        params.update(lock_key=None, below=None)
    elif limit <= quota.QUOTA_LOCK_MARGIN:
        return None
    else:
        params.update(lock_key=quota.quota_lock_key(task.owner), below=limit - quota.QUOTA_LOCK_MARGIN)
    return "task_create", params


def _insert_created_sql(task: Task, actor: str, detail: Mapping[str, Any]) -> bool:
    """Count the task in its owner's quota, insert it and its ``created``
    event, in one statement (``task_create``; its own transaction, or the
    caller's). Returns ``False``, having done
    nothing, when the owner is near its quota: the caller then takes the
    exclusive path of ``quota.take_place``.

    Far below the quota the statement takes the owner's lock shared, as
    ``take_place`` does, and holds it until it commits, so an exclusive
    checker still waits for this creation before it reads the count.
    """
    named = _created_statement(task, actor, detail)
    if named is None or sql.execute(*named).rowcount != 1:
        return False
    task._state.adding = False
    task._state.db = connection.alias
    return True
