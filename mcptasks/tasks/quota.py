"""The per-owner quota of active tasks, and the count that enforces it.

Each owner's count of working or waiting tasks is the sum of its
``ActiveTaskCount`` slots. A creation adds one and a move to a terminal
status takes one away, in the same statement or transaction as the task's
own write, so the sum equals the tasks' ``COUNT`` at every commit and a
creation never counts the tasks.

One owner's writers must not wait for each other's commits (a creation in an
open transaction would hold up every other creation of its owner). So on
Postgres (the ``*_kept`` and ``*_added`` parts of the statements in
``queries.sql``) a write takes any of the owner's slots no other transaction holds
(``SKIP LOCKED``), or else adds a slot keyed by its own transaction id, which
no other transaction has. An owner so has about as many slots as it ever had
writers at once. A slot may go below zero; only the sum counts. The ORM path
(other databases, which write one transaction at a time anyway) keeps slot 0.
``reconcile`` folds each owner's slots back into one and corrects any drift
from writes made outside these functions.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count, F, Sum

from ..conf import settings
from ..models import ACTIVE_STATUSES, ActiveTaskCount, Task
from . import sql

logger = logging.getLogger("mcptasks.lifecycle")


class TooManyActiveTasks(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"Too many active tasks: at most {limit} may be working or waiting at once")
        self.limit = limit


#: How far below the quota an owner's count must be for a creation to share
#: the per-owner lock instead of taking it alone. Sharers run side by side, so
#: the quota stays exact while fewer than this many creations of one owner are
#: in flight at once (a web process runs at most ``WEB_THREADS``).
QUOTA_LOCK_MARGIN = 256


def quota_lock_key(owner: str) -> str:
    return f"mcptasks:{owner}"


def active_count(owner: str) -> int:
    """The owner's working and waiting tasks, from its slots."""
    return ActiveTaskCount.objects.filter(owner=owner).aggregate(n=Sum("active"))["n"] or 0


def take_place(owner: str) -> None:
    """Count a new active task of ``owner``, or raise ``TooManyActiveTasks``
    when ``MAX_ACTIVE_TASKS_PER_OWNER`` are active already: the ORM twin of
    ``task_create``'s count, inside the creation's transaction (other
    databases write one transaction at a time).

    On Postgres (``creation``) every creation holds a transaction-scoped
    advisory lock on its owner, in one mode only (never upgraded, so never a
    deadlock). Far below the limit it is shared, so one owner's creations do
    not wait for each other. Near it, the lock is exclusive, which waits for
    every creation in flight to commit, and the count is read again under it.
    """
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    if limit is not None:
        if connection.vendor == "postgresql":  # the twin on Postgres (tests): the owner's lock, alone
            sql.execute("quota_lock_exclusive", {"lock_key": quota_lock_key(owner)})
        if active_count(owner) >= limit:
            raise TooManyActiveTasks(limit)
    adjust(owner, 1)


def adjust(owner: str, delta: int) -> None:
    """Add ``delta`` to the owner's count, in the caller's transaction (the
    ORM twin of the statements' ``counted_*`` and ``uncounted_*`` parts)."""
    mine = ActiveTaskCount.objects.filter(owner=owner, slot=0)
    if mine.update(active=F("active") + delta):
        return
    try:
        with transaction.atomic():
            ActiveTaskCount.objects.create(owner=owner, slot=0, active=delta)
    except IntegrityError:  # another transaction created it meanwhile
        mine.update(active=F("active") + delta)


#: How long the reconcile waits for the writers in flight before it gives up
#: until the next prune: writers that arrive meanwhile queue behind it.
RECONCILE_LOCK_TIMEOUT_MS = 200
#: Postgres's SQLSTATE for a lock timeout.
LOCK_NOT_AVAILABLE = "55P03"


def reconcile() -> int:
    """Recompute every owner's count from its tasks, fold its slots into one
    and drop owners with none active. Returns how many owners' counts were
    wrong (writes made outside ``mcptasks.tasks``; normally none).

    Exact under concurrency: on Postgres the slots' table is locked against
    writers first, which waits for every transaction that changed a count.
    A transaction that moved a task but has not yet changed its count is not
    seen by the recount and changes the count after this commits. When a
    writer holds on longer than ``RECONCILE_LOCK_TIMEOUT_MS`` (a creation in
    a long transaction), this round is skipped rather than stall the others.
    """
    try:
        return _reconcile()
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        logger.info("active task counts not reconciled: a writer held them past the lock timeout")
        return 0


def _reconcile() -> int:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            sql.execute("counts_lock_timeout", {"timeout": f"{int(RECONCILE_LOCK_TIMEOUT_MS)}ms"})
            sql.execute("counts_lock")
            # Only the lock waits this little: not the rest of a caller's transaction.
            sql.execute("counts_lock_timeout_reset")
        counted = dict(
            Task.objects.filter(status__in=ACTIVE_STATUSES)
            .order_by()
            .values_list("owner")
            .annotate(n=Count("pk"))
            .values_list("owner", "n")
        )
        kept = {
            owner: (total, slots)
            for owner, total, slots in ActiveTaskCount.objects.order_by()
            .values_list("owner")
            .annotate(total=Sum("active"), slots=Count("pk"))
            .values_list("owner", "total", "slots")
        }
        wrong = [owner for owner in counted.keys() | kept.keys() if counted.get(owner, 0) != kept.get(owner, (0,))[0]]
        untidy = [owner for owner, (total, slots) in kept.items() if slots > 1 or total == 0]
        rewrite = set(wrong) | set(untidy)
        if rewrite:
            ActiveTaskCount.objects.filter(owner__in=rewrite).delete()
            ActiveTaskCount.objects.bulk_create(
                ActiveTaskCount(owner=owner, slot=0, active=counted[owner]) for owner in rewrite if counted.get(owner)
            )
    if wrong:
        logger.warning("active task counts corrected for %d owner(s)", len(wrong), extra={"owners": len(wrong)})
    return len(wrong)
