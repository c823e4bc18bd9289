"""A worker's runs: the claim of a lease, heartbeats, status messages,
release, retries and slot waits, each written by the process's store
(``store.backend()``: on Postgres ``run_claim``, ``lease_renew``,
``lease_release``, ``run_status_message``, ``run_retry``,
``run_slot_wait``). The first claim stamps the task's ``started_at``, which
ends its queue wait."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from ..conf import settings
from ..errors import INTERNAL_ERROR
from ..models import Task, TaskEvent
from .events import SYSTEM, EventKind, worker_actor
from .store import backend, orm
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
    claimed = backend().claim(task_id, worker=worker, actor=worker_actor(worker), now=now, lease=lease)
    if claimed is None:
        return None
    run = Run(*claimed)
    if run.task.attempts > settings.MAX_ATTEMPTS:
        fail(
            task_id,
            {"code": INTERNAL_ERROR, "message": f"Task abandoned: its run was lost {run.task.attempts - 1} times."},
            actor=SYSTEM,
        )
        return None
    return run


def heartbeat(task_id: str, *, worker: str) -> bool:
    """Renew the lease. False when the task is no longer this worker's to run."""
    return worker in renew_leases({worker: task_id})


def renew_leases(runs: dict[str, str]) -> set[str]:
    """``heartbeat`` for many runs (worker name -> task id) in one statement.
    Returns the workers that still hold their task's lease."""
    if not runs:
        return set()
    return backend().renew_leases(runs, timezone.now() + timedelta(seconds=settings.LEASE_SECONDS))


def held_leases(runs: dict[str, str]) -> set[str]:
    """The workers (of ``runs``: worker name -> task id) whose task is still
    ``working`` under their lease, in one statement."""
    if not runs:
        return set()
    return set(orm.held(runs).values_list("lease_owner", flat=True))


def set_status_message(task_id: str, message: str, *, worker: str, progress: dict[str, Any] | None = None) -> bool:
    """The running task's status message, while ``worker`` holds its lease,
    announced to listeners (with the tool's ``progress`` numbers, when it
    gave them: 2025-era sessions get them as ``notifications/progress``).
    A run's reports reach here coalesced (``mcptasks.worker.progress``).
    False when the task is no longer this worker's to run."""
    return backend().set_status_message(task_id, message, worker=worker, actor=worker_actor(worker), progress=progress)


def release(task_id: str, *, worker: str) -> None:
    """Give up the lease without finishing (the worker is shutting down)."""
    backend().release(task_id, worker=worker)


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
    count it."""
    now = timezone.now()
    due = now + timedelta(seconds=delay)
    error = error[:200]
    message = f"Attempt {attempt} at {due:%H:%M:%S} UTC (in {delay:.1f} s), after {error}"
    detail = {"attempt": attempt, "delay": round(delay, 3), "error": error}
    return backend().schedule_retry(
        task_id, worker=worker, actor=worker_actor(worker), now=now, due=due, message=message, detail=detail
    )


def wait_for_slot(task_id: str, *, delay: float, message: str) -> bool:
    """Every concurrency slot of the task's tool is held: the task, which no
    run claimed, stays ``working`` with its next try due in ``delay``
    seconds and ``message`` as its status (listeners hear of it when the
    message changes). ``False`` when the task is no longer waiting to run
    (finished, cancelled, asking, or running elsewhere): nothing to retry."""
    now = timezone.now()
    due = now + timedelta(seconds=delay)
    return backend().wait_for_slot(task_id, now=now, due=due, message=message)
