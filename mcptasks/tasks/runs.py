"""A worker's runs: claims, heartbeats, status messages and release, each a ``store.backend()`` step."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from ..conf import settings
from ..errors import INTERNAL_ERROR
from ..models import Task
from .events import SYSTEM, worker_actor
from .store import backend, orm
from .transitions import fail


@dataclass(frozen=True)
class Run:
    """A claimed run: the task, and the answers (key -> response) its earlier runs were given."""

    task: Task
    answers: dict[str, Any]


def claim(task_id: str, *, worker: str) -> Task | None:
    """Lease a ``working`` task with no live lease; ``None`` if terminal, waiting or running (a duplicate)."""
    run = start_run(task_id, worker=worker)
    return run.task if run is not None else None


def start_run(task_id: str, *, worker: str) -> Run | None:
    """``claim``, with the recorded answers the run replays (the first claim ends the queue wait)."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEASE_SECONDS)
    claimed = backend().claim(task_id, worker=worker, actor=worker_actor(worker), now=now, lease=lease)
    if claimed is None:
        return None
    run = Run(*claimed)
    if run.task.attempts > settings.MAX_ATTEMPTS:
        lost = f"Task abandoned: its run was lost {run.task.attempts - 1} times."
        fail(task_id, {"code": INTERNAL_ERROR, "message": lost}, actor=SYSTEM)
        return None
    return run


def heartbeat(task_id: str, *, worker: str) -> bool:
    """Renew the lease; ``False`` when the task is no longer this worker's to run."""
    return worker in renew_leases({worker: task_id})


def renew_leases(runs: dict[str, str]) -> set[str]:
    """``heartbeat`` of many runs (worker -> task id) in one statement: the workers still holding their lease."""
    if not runs:
        return set()
    return backend().renew_leases(runs, timezone.now() + timedelta(seconds=settings.LEASE_SECONDS))


def held_leases(runs: dict[str, str]) -> set[str]:
    """The workers of ``runs`` (worker -> task id) whose task is still ``working`` under their lease."""
    return set(orm.held(runs).values_list("lease_owner", flat=True))


def set_status_message(task_id: str, message: str, *, worker: str, progress: dict[str, Any] | None = None) -> bool:
    """The running task's status message (and the tool's ``progress``) while ``worker`` holds its lease."""
    return backend().set_status_message(task_id, message, worker=worker, actor=worker_actor(worker), progress=progress)


def release(task_id: str, *, worker: str) -> None:
    """Give up the lease without finishing (the worker is shutting down)."""
    backend().release(task_id, worker=worker)
