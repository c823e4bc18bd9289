"""Maintenance: the sweeper that recovers lost runs, the prune of expired
tasks with the reconcile of the per-owner active counts, and expiring a task
at once; each write by the process's store (``store.backend()``: on Postgres
``run_redispatch``, ``prune_batch``, ``task_expire``)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from ..conf import settings
from ..errors import INTERNAL_ERROR
from ..models import ACTIVE_STATUSES, TERMINAL_STATUSES, Task, TaskEvent, TaskStatus
from ..telemetry import metrics
from . import dispatch, quota
from .events import SYSTEM, EventKind
from .store import backend
from .transitions import cancel, fail


@dataclass
class SweepReport:
    redispatched: int = 0
    failed: int = 0


def sweep(*, dry_run: bool = False, limit: int = 500) -> SweepReport:
    """Recover runs lost to dead workers or lost messages.

    * ``working`` with a lapsed lease: its worker died. Re-enqueue it, or fail
      it once its attempts are used up.
    * ``working`` with no lease, dispatched longer ago than the grace period:
      its message was lost between commit and publish. Re-enqueue it. The
      grace doubles with each re-enqueue since the task last started a run
      (see ``_unclaimed_due``), so a backlog is not re-enqueued at every sweep.
    """
    now = timezone.now()
    report = SweepReport()
    lapsed = list(
        Task.objects.filter(status=TaskStatus.WORKING, lease_expires_at__lt=now).values_list("id", "attempts")[:limit]
    )
    unclaimed = _unclaimed_due(now, limit)
    for task_id, attempts in lapsed + unclaimed:
        if attempts >= settings.MAX_ATTEMPTS:
            report.failed += 1
            if not dry_run:
                fail(
                    task_id,
                    {"code": INTERNAL_ERROR, "message": f"Task abandoned: its worker was lost {attempts} times."},
                    actor=SYSTEM,
                    # Only while still stuck: a run that renewed its lease meanwhile is alive.
                    lapsed_at=now,
                )
            continue
        report.redispatched += 1
        if dry_run:
            continue
        if backend().redispatch(task_id, attempts=attempts, now=now):
            transaction.on_commit(functools.partial(dispatch.enqueue_run, task_id))
    return report


#: The dispatch grace doubles with each re-enqueue of a task that nobody
#: claimed, up to this factor (16 x ``DISPATCH_GRACE_SECONDS``).
REDISPATCH_BACKOFF_MAX_FACTOR = 16


def _unclaimed_due(now: datetime, limit: int) -> list[tuple[str, int]]:
    """``working`` tasks with no lease whose re-enqueue is due, oldest first.

    A task's message may be lost (re-enqueue it after ``DISPATCH_GRACE_SECONDS``)
    or only waiting behind a backlog longer than the grace; the sweeper cannot
    tell the two apart. So the wait grows with each re-enqueue since the task
    last started a run: ``grace * 2**n`` (capped), where ``n`` counts its
    ``redispatched`` events after its last ``run_started``. The count comes
    from the audit trail, for the candidate rows only.
    """
    grace = settings.DISPATCH_GRACE_SECONDS
    # Rows still backing off may fill the first ``limit``: look a little further.
    candidates = list(
        Task.objects.filter(status=TaskStatus.WORKING, lease_expires_at__isnull=True)
        .filter(Q(dispatched_at__lt=now - timedelta(seconds=grace)) | Q(dispatched_at__isnull=True))
        .order_by(F("dispatched_at").asc(nulls_first=True), "id")
        .values_list("id", "attempts", "dispatched_at")[: limit * 4]
    )
    if not candidates:
        return []
    since_run: dict[str, int] = {}
    events = (
        TaskEvent.objects.filter(
            task_id__in=[c[0] for c in candidates], kind__in=(EventKind.RUN_STARTED, EventKind.REDISPATCHED)
        )
        .order_by("at", "id")
        .values_list("task_id", "kind")
    )
    for task_id, kind in events:
        since_run[task_id] = 0 if kind == EventKind.RUN_STARTED else since_run.get(task_id, 0) + 1
    due: list[tuple[str, int]] = []
    for task_id, attempts, dispatched_at in candidates:
        factor = min(2 ** since_run.get(task_id, 0), REDISPATCH_BACKOFF_MAX_FACTOR)
        if dispatched_at is None or dispatched_at < now - timedelta(seconds=grace * factor):
            due.append((task_id, attempts))
            if len(due) == limit:
                break
    return due


def prune_expired(*, batch_size: int | None = None, dry_run: bool = False, max_batches: int | None = None) -> int:
    """Delete terminal tasks past their TTL, a batch at a time so that polls
    never wait on a long delete. A running task is never expired.

    Then ``quota.reconcile`` recounts each owner's active tasks: it folds the
    slots concurrent writers added and corrects any drift from writes made
    outside ``mcptasks.tasks`` (one grouped count of the active tasks)."""
    size = batch_size or settings.PRUNE_BATCH_SIZE
    now = timezone.now()
    if dry_run:
        return _expired(now).count()
    delete_batch = backend().delete_expired_batch
    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic():
            deleted = delete_batch(now, size)
        if not deleted:
            break
        total += deleted
        batches += 1
        metrics.tasks_expired(deleted)
        if deleted == size and settings.PRUNE_PAUSE_SECONDS:
            time.sleep(settings.PRUNE_PAUSE_SECONDS)
    quota.reconcile()
    return total


def _expired(now: datetime) -> QuerySet[Task]:
    return Task.objects.filter(status__in=TERMINAL_STATUSES, expires_at__lt=now)


def expire_now(task_id: str, *, actor: str) -> bool:
    """Expire a task now, so that the next prune deletes it (an active one is
    cancelled first)."""
    now = timezone.now()
    with transaction.atomic():
        status = Task.objects.select_for_update().filter(pk=task_id).values_list("status", flat=True).first()
        if status is None:
            return False
        if status in ACTIVE_STATUSES:
            cancel(task_id, actor=actor, reason="The task was expired by an operator.")
        backend().mark_expired(task_id, now=now, actor=actor)
        return True
