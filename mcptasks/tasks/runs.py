"""A worker's runs: the claim of a lease, heartbeats, status messages and
release, each one statement on Postgres (``run_claim``, ``lease_renew``,
``lease_release``) beside its ORM twin. The first claim stamps the task's
``started_at``, which ends its queue wait."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..conf import settings
from ..errors import INTERNAL_ERROR
from ..models import InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from . import sql
from .events import STATUS_MESSAGE, SYSTEM, EventKind, announce, announce_committed, record_event, worker_actor
from .transitions import fail


@dataclass(frozen=True)
class Run:
    """A claimed run: the task as the claim left it, and the answers its
    earlier runs were given (key -> response)."""

    task: Task
    answers: dict[str, Any]


def claim(task_id: str, *, worker: str) -> Task | None:
    """Take the lease of a ``working`` task nobody holds a live lease on.

    Returns the task, or ``None`` when it is terminal, waiting for input or
    already running under a live lease elsewhere (a duplicate message).
    """
    run = start_run(task_id, worker=worker)
    return run.task if run is not None else None


def start_run(task_id: str, *, worker: str) -> Run | None:
    """``claim``, with the recorded answers the run replays."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEASE_SECONDS)
    if sql.single_statement():
        run = _claim_sql(task_id, worker=worker, now=now, lease=lease)
    else:
        run = _claim_orm(task_id, worker=worker, now=now, lease=lease)
    if run is None:
        return None
    if run.task.attempts > settings.MAX_ATTEMPTS:
        fail(
            task_id,
            {"code": INTERNAL_ERROR, "message": f"Task abandoned: its run was lost {run.task.attempts - 1} times."},
            actor=SYSTEM,
        )
        return None
    return run


def _claim_orm(task_id: str, *, worker: str, now: datetime, lease: datetime) -> Run | None:
    with transaction.atomic():
        got = (
            Task.objects.filter(pk=task_id, status=TaskStatus.WORKING)
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
            .update(
                lease_owner=worker,
                lease_expires_at=lease,
                attempts=F("attempts") + 1,
                started_at=Coalesce(F("started_at"), Value(now, output_field=models.DateTimeField())),
            )
        )
        if not got:
            return None
        task = Task.objects.get(pk=task_id)
        record_event(task_id, EventKind.RUN_STARTED, worker_actor(worker), now=now, detail={"attempt": task.attempts})
    answers = dict(
        InputRequest.objects.filter(task_id=task_id, state=InputRequestState.ANSWERED).values_list("key", "response")
    )
    return Run(task, answers)


def _claim_sql(task_id: str, *, worker: str, now: datetime, lease: datetime) -> Run | None:
    params = {
        "task_id": task_id,
        "worker": worker,
        "lease": lease,
        "now": now,
        "working": TaskStatus.WORKING.value,
        "kind": EventKind.RUN_STARTED.value,
        "actor": worker_actor(worker),
        "answered": InputRequestState.ANSWERED.value,
    }
    cursor = sql.execute("run_claim", params)
    row = cursor.fetchone()
    if row is None:
        return None
    answers = row[-1]
    if isinstance(answers, str):
        answers = json.loads(answers)
    return Run(Task.objects.from_row(sql.column_names(cursor)[:-1], row[:-1]), answers or {})


def heartbeat(task_id: str, *, worker: str) -> bool:
    """Renew the lease. False when the task is no longer this worker's to run."""
    return worker in renew_leases({worker: task_id})


def renew_leases(runs: dict[str, str]) -> set[str]:
    """``heartbeat`` for many runs (worker name -> task id) in one statement
    (``lease_renew``). Returns the workers that still hold their task's lease."""
    if not runs:
        return set()
    lease = timezone.now() + timedelta(seconds=settings.LEASE_SECONDS)
    if sql.single_statement():
        params = {
            "task_ids": list(set(runs.values())),
            "workers": list(runs),
            "lease": lease,
            "working": TaskStatus.WORKING.value,
        }
        return {row[0] for row in sql.execute("lease_renew", params).fetchall()}
    renewed = _held(runs).update(lease_expires_at=lease)
    return set(runs) if renewed == len(runs) else held_leases(runs)


def held_leases(runs: dict[str, str]) -> set[str]:
    """The workers (of ``runs``: worker name -> task id) whose task is still
    ``working`` under their lease, in one statement."""
    if not runs:
        return set()
    return set(_held(runs).values_list("lease_owner", flat=True))


def _held(runs: dict[str, str]) -> Any:
    # A worker name is unique to its run, so the two lists pair themselves.
    return Task.objects.filter(pk__in=set(runs.values()), lease_owner__in=list(runs), status=TaskStatus.WORKING)


def set_status_message(task_id: str, message: str, *, worker: str, progress: dict[str, Any] | None = None) -> bool:
    """The running task's status message, while ``worker`` holds its lease,
    announced to listeners (with the tool's ``progress`` numbers, when it
    gave them: 2025-era sessions get them as ``notifications/progress``).
    A run's reports reach here coalesced (``mcptasks.worker.progress``).
    False when the task is no longer this worker's to run."""
    now = timezone.now()
    actor = worker_actor(worker)
    if sql.single_statement():
        params = {
            "task_id": task_id,
            "message": message,
            "now": now,
            "working": TaskStatus.WORKING.value,
            "worker": worker,
        }
        cursor = sql.execute("run_status_message", params)
        row = cursor.fetchone()
        if row is None:
            return False
        task = Task.objects.from_row(sql.column_names(cursor), row)
        transaction.on_commit(
            lambda: announce_committed(task, TaskStatus.WORKING, actor, STATUS_MESSAGE, progress=progress)
        )
        return True
    with transaction.atomic():
        changed = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker).update(
            status_message=message, updated_at=now
        )
        if changed:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE, progress=progress)
        return bool(changed)


def release(task_id: str, *, worker: str) -> None:
    """Give up the lease without finishing (the worker is shutting down): ``lease_release``."""
    now = timezone.now()
    if sql.single_statement():
        sql.execute("lease_release", {"task_id": task_id, "worker": worker, "now": now})
        return
    Task.objects.filter(pk=task_id, lease_owner=worker).update(
        lease_expires_at=None, lease_owner="", attempts=F("attempts") - 1, dispatched_at=now
    )


def tool_retries(task_id: str) -> int:
    """How many tool retries the task has had (its ``tool_retry`` events)."""
    return TaskEvent.objects.filter(task_id=task_id, kind=EventKind.TOOL_RETRY).count()


def schedule_retry(task_id: str, *, worker: str, attempt: int, delay: float, error: str) -> bool:
    """The run's tool raised an exception it retries on: give the lease back
    with attempt ``attempt`` due in ``delay`` seconds (the task stays
    ``working``, its status message says when and why, a ``tool_retry``
    event records it). Only while ``worker`` holds the lease, so a run
    cancelled meanwhile is not retried. The caller sends the delayed run
    once this commits. ``attempts`` (lost runs, ``MAX_ATTEMPTS``) does not
    count it. On Postgres one statement (``run_retry``)."""
    now = timezone.now()
    due = now + timedelta(seconds=delay)
    error = error[:200]
    message = f"Attempt {attempt} at {due:%H:%M:%S} UTC (in {delay:.1f} s), after {error}"
    detail = {"attempt": attempt, "delay": round(delay, 3), "error": error}
    actor = worker_actor(worker)
    if sql.single_statement():
        params = {
            "task_id": task_id,
            "worker": worker,
            "working": TaskStatus.WORKING.value,
            "now": now,
            "due": due,
            "message": message,
            "kind": EventKind.TOOL_RETRY.value,
            "actor": actor,
            "detail": sql.db_value(TaskEvent, "detail", detail),
        }
        cursor = sql.execute("run_retry", params)
        row = cursor.fetchone()
        if row is None:
            return False
        task = Task.objects.from_row(sql.column_names(cursor), row)
        announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE, task=task)
        return True
    with transaction.atomic():
        moved = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker).update(
            lease_owner="",
            lease_expires_at=None,
            attempts=F("attempts") - 1,
            dispatched_at=due,
            status_message=message,
            updated_at=now,
        )
        if not moved:
            return False
        record_event(task_id, EventKind.TOOL_RETRY, actor, now=now, detail=detail)
        announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE)
    return True


def wait_for_slot(task_id: str, *, delay: float, message: str) -> bool:
    """Every concurrency slot of the task's tool is held: the task, which no
    run claimed, stays ``working`` with its next try due in ``delay``
    seconds and ``message`` as its status (listeners hear of it when the
    message changes). ``False`` when the task is no longer waiting to run
    (finished, cancelled, asking, or running elsewhere): nothing to retry.
    On Postgres one statement (``run_slot_wait``)."""
    now = timezone.now()
    due = now + timedelta(seconds=delay)
    if sql.single_statement():
        params = {
            "task_id": task_id,
            "working": TaskStatus.WORKING.value,
            "now": now,
            "due": due,
            "message": message,
        }
        cursor = sql.execute("run_slot_wait", params)
        row = cursor.fetchone()
        if row is None:
            return False
        task = Task.objects.from_row(sql.column_names(cursor), row)
        if task.updated_at == now:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, SYSTEM, STATUS_MESSAGE, task=task)
        return True
    with transaction.atomic():
        waiting = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING).filter(
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
        )
        changed = waiting.exclude(status_message=message).update(
            dispatched_at=due, status_message=message, updated_at=now
        )
        if changed:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, SYSTEM, STATUS_MESSAGE)
            return True
        return bool(waiting.update(dispatched_at=due))
