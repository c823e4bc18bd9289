"""A tool's retries (an execution control): the attempts so far, and the next one scheduled under the
run's lease, a ``store.backend()`` step (on Postgres ``controls.sql``'s ``run_retry``)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from ..models import TaskEvent
from .events import EventKind, worker_actor
from .store import backend


def tool_retries(task_id: str) -> int:
    return TaskEvent.objects.filter(task_id=task_id, kind=EventKind.TOOL_RETRY).count()


def schedule_retry(task_id: str, *, worker: str, attempt: int, delay: float, error: str) -> bool:
    """Under ``worker``'s lease, give it back as attempt ``attempt`` due in ``delay`` s; sent once this commits."""
    now = timezone.now()
    due = now + timedelta(seconds=delay)
    error = error[:200]
    message = f"Attempt {attempt} at {due:%H:%M:%S} UTC (in {delay:.1f} s), after {error}"
    detail = {"attempt": attempt, "delay": round(delay, 3), "error": error}
    return backend().schedule_retry(
        task_id, worker=worker, actor=worker_actor(worker), now=now, due=due, message=message, detail=detail
    )
