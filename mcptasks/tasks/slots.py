"""Concurrency slots: at most ``concurrency`` runs of a tool at once, across
every worker of the site, decided by the database.

A tool with a limit has that many ``ToolSlot`` rows. A run takes a free one
before it claims its task (``take``) and gives it back when it ends
(``free``); while it runs, the lease monitor renews the slot with the lease
(``renew``), so the slot of a killed worker comes free when its lease would
have lapsed. On Postgres each step is one statement (``slot_*`` in
queries.sql); elsewhere its ORM twin here, a compare-and-set on the slot row
(row locks where the database has them, MariaDB's ``SKIP LOCKED``
included; SQLite's one writer at a time otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import settings
from ..models import Task, ToolSlot
from . import sql


def take(tool_name: str, limit: int, *, task_id: str, worker: str) -> int | None:
    """Take a free slot of ``tool_name`` (of ``limit``) for the run
    ``worker``: the slot's number, or ``None`` when all are held."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEASE_SECONDS)
    if sql.single_statement():
        sql.execute("slot_rows", {"tool": tool_name, "limit": limit})
        params = {"tool": tool_name, "limit": limit, "task_id": task_id, "worker": worker, "lease": lease, "now": now}
        row = sql.execute("slot_take", params).fetchone()
        return None if row is None else int(row[0])
    ToolSlot.objects.bulk_create([ToolSlot(tool_name=tool_name, slot=n) for n in range(limit)], ignore_conflicts=True)
    free = Q(expires_at__isnull=True) | Q(expires_at__lt=now)
    with transaction.atomic():
        candidates = ToolSlot.objects.filter(free, tool_name=tool_name, slot__lt=limit).order_by("slot")
        if _skip_locked():
            # Lock one free slot, passing over those other runs are taking.
            candidates = candidates.select_for_update(skip_locked=True)[:1]
        for slot in candidates:
            # Compare-and-set: only if nobody took it since it was read.
            taken = ToolSlot.objects.filter(free, pk=slot.pk, worker=slot.worker, expires_at=slot.expires_at).update(
                task_id=task_id, worker=worker, expires_at=lease
            )
            if taken:
                return slot.slot
    return None


def _skip_locked() -> bool:
    from django.db import connection

    return bool(connection.features.has_select_for_update_skip_locked)


def renew(workers: Iterable[str]) -> None:
    """The slots held by these runs, renewed with their leases."""
    held = list(workers)
    if not held:
        return
    lease = timezone.now() + timedelta(seconds=settings.LEASE_SECONDS)
    if sql.single_statement():
        sql.execute("slot_renew", {"lease": lease, "workers": held})
        return
    ToolSlot.objects.filter(worker__in=held).update(expires_at=lease)


def free(worker: str) -> None:
    """The run ``worker`` gives its slot back."""
    if sql.single_statement():
        sql.execute("slot_free", {"worker": worker})
        return
    ToolSlot.objects.filter(worker=worker).update(task_id="", worker="", expires_at=None)


def held(tool_name: str) -> int:
    """How many slots of the tool are held now (for operators)."""
    now = timezone.now()
    return ToolSlot.objects.filter(tool_name=tool_name, expires_at__gte=now).exclude(worker="").count()


def tool_name_of(task_id: str) -> str | None:
    """The tool of a task, before any run claims it (to find its limit)."""
    return Task.objects.filter(pk=task_id).values_list("tool_name", flat=True).first()
