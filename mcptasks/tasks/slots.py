"""Concurrency slots: at most ``concurrency`` runs of a tool at once, across
every worker of the site, decided by the database.

A tool with a limit has that many ``ToolSlot`` rows. A run takes a free one
before it claims its task (``take``; with none free, the task waits:
``wait_for_slot``) and gives it back when it ends (``free``); while it
runs, the lease monitor renews the slot with the lease (``renew``), so the
slot of a killed worker comes free when its lease would have lapsed. The
process's store writes each step (``store.backend()``: on Postgres the
``slot_*`` statements of controls.sql; elsewhere a compare-and-set on the
slot row).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.utils import timezone

from ..conf import settings
from ..models import Task, ToolSlot
from .store import backend


def take(tool_name: str, limit: int, *, task_id: str, worker: str) -> int | None:
    """Take a free slot of ``tool_name`` (of ``limit``) for the run
    ``worker``: the slot's number, or ``None`` when all are held."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEASE_SECONDS)
    return backend().take_slot(tool_name, limit, task_id=task_id, worker=worker, now=now, lease=lease)


def renew(workers: Iterable[str]) -> None:
    """The slots held by these runs, renewed with their leases."""
    held = list(workers)
    if not held:
        return
    lease = timezone.now() + timedelta(seconds=settings.LEASE_SECONDS)
    backend().renew_slots(held, lease)


def wait_for_slot(task_id: str, *, delay: float, message: str) -> bool:
    """Every slot of the task's tool is held: the unclaimed task stays ``working``,
    due again in ``delay`` seconds; ``False`` when it is no longer waiting to run."""
    now = timezone.now()
    return backend().wait_for_slot(task_id, now=now, due=now + timedelta(seconds=delay), message=message)


def free(worker: str) -> None:
    """The run ``worker`` gives its slot back."""
    backend().free_slot(worker)


def held(tool_name: str) -> int:
    """How many slots of the tool are held now (for operators)."""
    now = timezone.now()
    return ToolSlot.objects.filter(tool_name=tool_name, expires_at__gte=now).exclude(worker="").count()


def tool_name_of(task_id: str) -> str | None:
    """The tool of a task, before any run claims it (to find its limit)."""
    return Task.objects.filter(pk=task_id).values_list("tool_name", flat=True).first()
