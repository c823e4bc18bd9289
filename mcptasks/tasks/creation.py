"""Creating a task, within the per-owner quota of active tasks.

On Postgres one statement (``task_create``) counts the task in its owner's
quota (``quota``) and inserts it, the answers it was created with and its
``created`` event (``_insert_created_sql``); on other databases its ORM
twin (``_insert_created_orm``) does the same in a transaction.
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
    if sql.single_statement():
        _insert_created_sql(task, actor, detail, answered or {})
    else:
        _insert_created_orm(task, actor, detail, answered or {})
    transaction.on_commit(lambda: send_created(task))
    announce(task.id, "", TaskStatus.WORKING, actor, EventKind.CREATED, task=task)
    metrics.task_created(tool_name)
    if enqueue:
        enqueue_after_commit(task.id, task.tool_name)
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
    await send(task.id, dispatch.route(tool_name))
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


def _create_params(
    task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Answer] | None
) -> dict[str, Any]:
    """``task_create``'s parameters, but for the quota's."""
    params = column_params(task)
    answers = {
        key: {"method": a.method, "params": a.params, "response": a.response} for key, a in (answered or {}).items()
    }
    params.update(
        kind=EventKind.CREATED.value,
        actor=actor,
        detail=sql.db_value(TaskEvent, "detail", dict(detail)),
        answers=sql.db_value(InputRequest, "params", answers),
        answered=InputRequestState.ANSWERED.value,
    )
    return params


def _created_statement(
    task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Answer] | None = None
) -> tuple[str, dict[str, Any]] | None:
    """The creation statement and its parameters far below the owner's
    quota (its lock shared), or ``None`` when the quota is too small for a
    creation to share its lock."""
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    if limit is not None and limit <= quota.QUOTA_LOCK_MARGIN:
        return None
    params = _create_params(task, actor, detail, answered)
    if limit is None:
        params.update(lock_key=None, below=None)
    else:
        params.update(lock_key=quota.quota_lock_key(task.owner), below=limit - quota.QUOTA_LOCK_MARGIN)
    return "task_create", params


def _insert_created_sql(task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Answer]) -> None:
    """Count the task in its owner's quota, insert it, its answers and its
    ``created`` event (``task_create``; its own transaction, or the
    caller's), or raise ``TooManyActiveTasks``.

    Far below the quota the statement takes the owner's lock shared and
    holds it until it commits, so an exclusive checker still waits for this
    creation before it reads the count. Near it (where the statement inserts
    nothing), the owner's lock is taken alone (``quota_lock_exclusive``),
    which waits for every creation in flight, and the same statement counts
    afresh under it, against the quota itself.
    """
    named = _created_statement(task, actor, detail, answered)
    if named is None or sql.execute(*named).rowcount != 1:
        limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
        assert limit is not None, "without a quota the statement always inserts"
        with transaction.atomic():
            sql.execute("quota_lock_exclusive", {"lock_key": quota.quota_lock_key(task.owner)})
            params = {**_create_params(task, actor, detail, answered), "lock_key": None, "below": limit}
            if sql.execute("task_create", params).rowcount != 1:
                raise quota.TooManyActiveTasks(limit)
    task._state.adding = False
    task._state.db = connection.alias


def _insert_created_orm(task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Answer]) -> None:
    """The ORM twin of ``task_create`` (other databases)."""
    with transaction.atomic():
        quota.take_place(task.owner)
        task.save(force_insert=True)
        InputRequest.objects.bulk_create(
            InputRequest(
                task=task,
                key=key,
                method=a.method,
                params=a.params,
                response=a.response,
                state=InputRequestState.ANSWERED,
                answered_at=task.created_at,
            )
            for key, a in answered.items()
        )
        record_event(
            task.id, EventKind.CREATED, actor, now=task.created_at, to_status=TaskStatus.WORKING, detail=detail
        )
