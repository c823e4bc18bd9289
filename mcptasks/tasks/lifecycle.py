"""The one module that changes a task's status.

Every transition is a compare-and-set: it names the statuses it may start from,
locks the row (Postgres), and updates it only if the status is still one of
them. A terminal status is final. So a worker finishing while a cancel arrives,
or two answers racing, can never break ``working <-> input_required ->
completed | failed | cancelled``.

Views, the admin, management commands and workers all call these functions.
Each successful transition writes a ``TaskEvent`` and, once committed, sends
``signals.task_changed`` and logs a structured line.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone

from .. import signals
from ..conf import settings
from ..models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    Era,
    InputRequest,
    InputRequestState,
    Task,
    TaskEvent,
    TaskStatus,
)
from ..tools.context import validate_input_response
from ..tools.registry import registry
from . import dispatch
from .inputs import pending_inputs

logger = logging.getLogger("mcptasks.lifecycle")

SYSTEM = "system"


def client_actor(owner: str) -> str:
    return f"client:{owner}"


def operator_actor(username: str) -> str:
    return f"operator:{username}"


def worker_actor(name: str) -> str:
    return f"worker:{name}"


def _snapshot(task_id: str) -> tuple[Task | None, dict[str, Any] | None]:
    """The task as this change leaves it (read inside the transaction), for
    listeners that must see every transition; skipped when nobody listens."""
    if not signals.task_changed.has_listeners(Task):
        return None, None
    task = Task.objects.filter(pk=task_id).first()
    pending = None
    if task is not None and task.status == TaskStatus.INPUT_REQUIRED:
        pending = pending_inputs(task_id)
    return task, pending


def _after_commit(
    task_id: str, from_status: str, to_status: str, actor: str, kind: str, *, task: Task | None = None
) -> None:
    """Log and signal the change once it is committed (never before: a
    listener must not see what a rollback undoes). ``task``, when the caller
    has the row as the change left it, saves the snapshot query."""
    if task is not None:
        pending: dict[str, Any] | None = {}
    else:
        task, pending = _snapshot(task_id)

    def send() -> None:
        logger.info(
            "task %s %s %s -> %s by %s",
            task_id,
            kind,
            from_status or "-",
            to_status,
            actor,
            extra={
                "task_id": task_id,
                "kind": kind,
                "from_status": from_status,
                "to_status": to_status,
                "actor": actor,
            },
        )
        signals.task_changed.send(
            sender=Task,
            task_id=task_id,
            from_status=from_status,
            to_status=to_status,
            actor=actor,
            kind=kind,
            task=task,
            pending_inputs=pending,
        )

    transaction.on_commit(send)


def _record(
    task_id: str,
    kind: str,
    actor: str,
    *,
    now: datetime,
    from_status: str = "",
    to_status: str = "",
    detail: Mapping[str, Any] | None = None,
) -> None:
    TaskEvent.objects.create(
        task_id=task_id,
        at=now,
        kind=kind,
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        detail=dict(detail or {}),
    )


def _enqueue_after_commit(task_id: str) -> None:
    transaction.on_commit(lambda: dispatch.enqueue_run(task_id))


# Creation -------------------------------------------------------------------


def clamp_ttl(requested_ms: int | None, tool_default_ms: int | None = None) -> int:
    """The TTL a new task gets: the request's (or the tool's, or the site's)
    default, never above ``MAX_TTL_MS``."""
    ttl = requested_ms if requested_ms is not None else tool_default_ms
    if ttl is None:
        ttl = settings.DEFAULT_TTL_MS
    return max(0, min(int(ttl), settings.MAX_TTL_MS))


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
    )
    actor = client_actor(owner)
    detail = {"tool": tool_name, "era": era}
    if not (_single_statement_transitions() and not answered and _insert_created_sql(task, actor, detail)):
        with transaction.atomic():
            _check_active_quota(owner)
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
            _record(task.id, "created", actor, now=now, to_status=TaskStatus.WORKING, detail=detail)
    transaction.on_commit(lambda: signals.task_created.send(sender=Task, task=task))
    _after_commit(task.id, "", TaskStatus.WORKING, actor, "created", task=task)
    if enqueue:
        _enqueue_after_commit(task.id)
    return task


class TooManyActiveTasks(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"Too many active tasks: at most {limit} may be working or waiting at once")
        self.limit = limit


#: How far below the quota an owner's count must be for a creation to share
#: the per-owner lock instead of taking it alone. Sharers run side by side, so
#: the quota stays exact while fewer than this many creations of one owner are
#: in flight at once (a web process runs at most ``WEB_THREADS``).
QUOTA_LOCK_MARGIN = 256


def _check_active_quota(owner: str) -> None:
    """``MAX_ACTIVE_TASKS_PER_OWNER``, exact under concurrency.

    On Postgres every creation holds a transaction-scoped advisory lock on
    its owner, in one mode only (never upgraded, so never a deadlock). Far
    below the limit it is shared, so one owner's creations do not wait for
    each other's commits. Near it, the lock is exclusive, which waits for
    every creation in flight to commit, and the count is taken again under it.
    """
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    if limit is None:
        return
    if connection.vendor == "postgresql":
        shared = _far_below_quota(owner, limit)
        function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {function}(hashtextextended(%s, 0))", [_quota_lock_key(owner)])
        if shared:
            return
    if Task.objects.filter(owner=owner, status__in=ACTIVE_STATUSES).count() >= limit:
        raise TooManyActiveTasks(limit)


def _far_below_quota(owner: str, limit: int) -> bool:
    """Whether ``owner`` is far enough below ``limit`` for a creation to take
    the quota lock shared (Postgres), from a count taken without the lock."""
    if limit <= QUOTA_LOCK_MARGIN:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {_tables()['task']} WHERE owner = %s AND status = ANY(%s)",
            [owner, list(ACTIVE_STATUSES)],
        )
        (active,) = cursor.fetchone()
    return active < limit - QUOTA_LOCK_MARGIN


def _quota_lock_key(owner: str) -> str:
    return f"mcptasks:{owner}"


# The guarded transition -------------------------------------------------------


def _transition(
    task_id: str,
    *,
    allowed_from: Iterable[str],
    to: str,
    actor: str,
    kind: str = "transition",
    fields: Mapping[str, Any] | None = None,
    extra_filter: Q | None = None,
    detail: Mapping[str, Any] | None = None,
) -> bool:
    """Move ``task_id`` to ``to`` if its status is in ``allowed_from``.

    Must run inside ``transaction.atomic``. Returns whether it moved.
    """
    allowed = tuple(allowed_from)
    qs = Task.objects.select_for_update().filter(pk=task_id)
    current = qs.values_list("status", flat=True).first()
    if current is None or current not in allowed:
        return False
    now = timezone.now()
    update = Task.objects.filter(pk=task_id, status=current)
    if extra_filter is not None:
        update = update.filter(extra_filter)
    changed = update.update(status=to, updated_at=now, **dict(fields or {}))
    if not changed:
        return False
    _record(task_id, kind, actor, now=now, from_status=current, to_status=to, detail=detail)
    if to in TERMINAL_STATUSES and current == TaskStatus.INPUT_REQUIRED:
        # Questions are pending only while the task waits (request_input
        # records them in the same transaction as the move to input_required).
        InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).update(
            state=InputRequestState.WITHDRAWN
        )
    _after_commit(task_id, current, to, actor, kind)
    return True


_CLEAR_LEASE = {"lease_owner": "", "lease_expires_at": None}


def complete(task_id: str, result: dict[str, Any], *, worker: str, failed: bool = False, message: str = "") -> bool:
    """The run finished with a result. Only the run holding the lease may
    finish the task, so a run that lost its lease cannot overwrite another's.

    ``failed`` is for the 2025-11-25 era, where an ``isError`` result fails
    the task (the result is still kept for ``tasks/result``).
    """
    to = TaskStatus.FAILED if failed else TaskStatus.COMPLETED
    fields = {"result": result, "status_message": message, **_CLEAR_LEASE}
    if _single_statement_transitions():
        # From ``working`` only, so the compare-and-set needs no row read
        # first: one UPDATE, its event and the row for listeners, one round trip.
        return _finish_run_sql(task_id, to=to, worker=worker, fields=fields)
    with transaction.atomic():
        return _transition(
            task_id,
            allowed_from=[TaskStatus.WORKING],
            to=to,
            actor=worker_actor(worker),
            extra_filter=Q(lease_owner=worker),
            fields=fields,
        )


def fail(
    task_id: str,
    error: dict[str, Any],
    *,
    actor: str,
    worker: str | None = None,
    message: str = "",
    only_if: Q | None = None,
) -> bool:
    """End the task ``failed`` with a JSON-RPC error. With ``worker``, only
    while that run holds the lease; with ``only_if``, only while the row
    still matches it."""
    guard = Q(lease_owner=worker) if worker else None
    if only_if is not None:
        guard = only_if if guard is None else guard & only_if
    with transaction.atomic():
        return _transition(
            task_id,
            allowed_from=ACTIVE_STATUSES,
            to=TaskStatus.FAILED,
            actor=actor,
            extra_filter=guard,
            fields={"error": error, "status_message": message or str(error.get("message", "")), **_CLEAR_LEASE},
        )


def cancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """Cancel an active task now. The running tool sees it through its context;
    a queued run that has not started finds the task terminal and never runs."""
    with transaction.atomic():
        return _cancel(task_id, actor=actor, reason=reason or "The task was cancelled.")


def _cancel(task_id: str, *, actor: str, reason: str) -> bool:
    """The cancel transition; inside the caller's transaction."""
    return _transition(
        task_id,
        allowed_from=ACTIVE_STATUSES,
        to=TaskStatus.CANCELLED,
        actor=actor,
        fields={"cancel_requested_at": timezone.now(), "cancelled_by": actor, "status_message": reason, **_CLEAR_LEASE},
    )


def request_input(task_id: str, requests: Mapping[str, Mapping[str, Any]], *, worker: str, message: str = "") -> bool:
    """A run needs answers it does not have: record the questions, move the
    task to ``input_required`` and release the worker.

    Keys already recorded keep their original request (a key never changes
    meaning over the task's life).
    """
    with transaction.atomic():
        mine = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker)
        if not mine.exists():
            return False
        existing = set(
            InputRequest.objects.filter(task_id=task_id, key__in=list(requests)).values_list("key", flat=True)
        )
        # The questions first, so that the transition's snapshot lists them.
        InputRequest.objects.bulk_create(
            InputRequest(task_id=task_id, key=key, method=req["method"], params=req.get("params", {}))
            for key, req in requests.items()
            if key not in existing
        )
        moved = _transition(
            task_id,
            allowed_from=[TaskStatus.WORKING],
            to=TaskStatus.INPUT_REQUIRED,
            actor=worker_actor(worker),
            extra_filter=Q(lease_owner=worker),
            fields={"status_message": message or "Waiting for input.", "attempts": 0, **_CLEAR_LEASE},
            detail={"keys": sorted(requests)},
        )
        if not moved:
            transaction.set_rollback(True)
        return moved


def submit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """Record answers to outstanding requests; resume the task when none is left.

    Keys that are unknown, already answered or withdrawn are ignored. Returns
    the keys accepted. Answers are applied at most once: each row moves from
    ``pending`` under the task's row lock.
    """
    now = timezone.now()
    with transaction.atomic():
        status = Task.objects.select_for_update().filter(pk=task_id).values_list("status", flat=True).first()
        if status not in ACTIVE_STATUSES:
            return []
        accepted: list[str] = []
        pending = InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING)
        matched = list(pending.filter(key__in=list(responses)))
        for req in matched:
            # All or nothing: one malformed answer refuses the whole update
            # (-32602) before any is recorded.
            validate_input_response(req.method, req.key, responses[req.key])
        for req in matched:
            answer = responses[req.key]
            if InputRequest.objects.filter(pk=req.pk, state=InputRequestState.PENDING).update(
                state=InputRequestState.ANSWERED, response=answer, answered_at=now
            ):
                accepted.append(req.key)
        if not accepted:
            return accepted
        _record(task_id, "input", actor, now=now, detail={"keys": accepted})
        if status == TaskStatus.INPUT_REQUIRED and not pending.exists():
            _transition(
                task_id,
                allowed_from=[TaskStatus.INPUT_REQUIRED],
                to=TaskStatus.WORKING,
                actor=actor,
                fields={"status_message": "", "dispatched_at": now},
            )
            _enqueue_after_commit(task_id)
        else:
            # Still waiting on other answers: listeners see the shorter list.
            Task.objects.filter(pk=task_id).update(updated_at=now)
            _after_commit(task_id, status, status, actor, "input")
        return accepted


# Worker bookkeeping (guarded, but not status changes) -----------------------------


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
    if _single_statement_transitions():
        run = _claim_sql(task_id, worker=worker, now=now, lease=lease)
    else:
        run = _claim_orm(task_id, worker=worker, now=now, lease=lease)
    if run is None:
        return None
    if run.task.attempts > settings.MAX_ATTEMPTS:
        fail(
            task_id,
            {"code": -32603, "message": f"Task abandoned: its run was lost {run.task.attempts - 1} times."},
            actor=SYSTEM,
        )
        return None
    return run


def _claim_orm(task_id: str, *, worker: str, now: datetime, lease: datetime) -> Run | None:
    with transaction.atomic():
        got = (
            Task.objects.filter(pk=task_id, status=TaskStatus.WORKING)
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
            .update(lease_owner=worker, lease_expires_at=lease, attempts=F("attempts") + 1)
        )
        if not got:
            return None
        task = Task.objects.get(pk=task_id)
        _record(task_id, "run_started", worker_actor(worker), now=now, detail={"attempt": task.attempts})
    answers = dict(
        InputRequest.objects.filter(task_id=task_id, state=InputRequestState.ANSWERED).values_list("key", "response")
    )
    return Run(task, answers)


def heartbeat(task_id: str, *, worker: str) -> bool:
    """Renew the lease. False when the task is no longer this worker's to run."""
    lease = timezone.now() + timedelta(seconds=settings.LEASE_SECONDS)
    return bool(
        Task.objects.filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker).update(lease_expires_at=lease)
    )


def set_status_message(task_id: str, message: str, *, worker: str) -> bool:
    with transaction.atomic():
        changed = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker).update(
            status_message=message, updated_at=timezone.now()
        )
        if changed:
            _after_commit(task_id, TaskStatus.WORKING, TaskStatus.WORKING, worker_actor(worker), "status_message")
        return bool(changed)


def release(task_id: str, *, worker: str) -> None:
    """Give up the lease without finishing (the worker is shutting down)."""
    Task.objects.filter(pk=task_id, lease_owner=worker).update(
        lease_expires_at=None, lease_owner="", attempts=F("attempts") - 1, dispatched_at=timezone.now()
    )


# Single-statement paths (Postgres) ------------------------------------------------
#
# A run's claim and its finish are the worker's hot path. On Postgres each is
# one statement (a data-modifying CTE: the guarded UPDATE, its event, and the
# row as left), so one round trip and one implicit commit, with no ORM query
# compilation. The guard is the UPDATE's own WHERE, which Postgres re-checks
# against the newest row version after waiting for a concurrent writer: the
# same compare-and-set as ``_transition``. Other databases take the ORM path.


def _single_statement_transitions() -> bool:
    return connection.vendor == "postgresql"


@functools.cache
def _task_columns() -> tuple[list[str], str]:
    """Task's field names and its quoted columns, in the same order."""
    fields = Task._meta.concrete_fields
    return [f.attname for f in fields], ", ".join(connection.ops.quote_name(f.column) for f in fields)


@functools.cache
def _tables() -> dict[str, str]:
    quote = connection.ops.quote_name
    return {
        "task": quote(Task._meta.db_table),
        "event": quote(TaskEvent._meta.db_table),
        "input": quote(InputRequest._meta.db_table),
    }


def _db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """``value`` as a raw statement's parameter for ``model.field`` (JSON
    wrapped for the driver, and so on), as the ORM would save it."""
    return model._meta.get_field(field).get_db_prep_save(value, connection)


def _insert_created_sql(task: Task, actor: str, detail: Mapping[str, Any]) -> bool:
    """Insert a new task and its ``created`` event in one statement (its own
    transaction, or the caller's). Returns ``False``, having done nothing,
    when the owner is near its quota: the caller then takes the exclusive
    path of ``_check_active_quota``.

    Far below the quota the statement takes the owner's lock shared, as
    ``_check_active_quota`` does, and holds it until it commits, so an
    exclusive checker still waits for this creation before it counts.
    """
    limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
    params: list[Any] = []
    lock = False
    if limit is not None:
        if not _far_below_quota(task.owner, limit):
            return False
        lock = True
        params.append(_quota_lock_key(task.owner))
    fields = Task._meta.concrete_fields
    params += [f.get_db_prep_save(f.pre_save(task, add=True), connection) for f in fields]
    sql = _created_sql(with_quota_lock=lock)
    params += [task.created_at, task.status, actor, _db_value(TaskEvent, "detail", dict(detail))]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    task._state.adding = False
    task._state.db = connection.alias
    return True


@functools.cache
def _created_sql(*, with_quota_lock: bool) -> str:
    """The task's INSERT and its ``created`` event, as one statement;
    optionally taking the owner's quota lock shared first."""
    t = _tables()
    names, columns = _task_columns()
    placeholders = ", ".join(["%s"] * len(names))
    if with_quota_lock:
        head = "WITH quota AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))), "
        source = f"SELECT {placeholders} FROM quota"
    else:
        head, source = "WITH ", f"VALUES ({placeholders})"
    return (
        f"{head}created AS (INSERT INTO {t['task']} ({columns}) {source} RETURNING id) "
        f"INSERT INTO {t['event']} (task_id, at, kind, from_status, to_status, actor, detail) "
        "SELECT id, %s, 'created', '', %s, %s, %s FROM created"
    )


def _claim_sql(task_id: str, *, worker: str, now: datetime, lease: datetime) -> Run | None:
    names, columns = _task_columns()
    t = _tables()
    sql = f"""
        WITH claimed AS (
            UPDATE {t["task"]} SET lease_owner = %s, lease_expires_at = %s, attempts = attempts + 1
            WHERE id = %s AND status = %s AND (lease_expires_at IS NULL OR lease_expires_at < %s)
            RETURNING {columns}
        ), started AS (
            INSERT INTO {t["event"]} (task_id, at, kind, from_status, to_status, actor, detail)
            SELECT id, %s, 'run_started', '', '', %s, jsonb_build_object('attempt', attempts) FROM claimed
        )
        SELECT claimed.*, (
            SELECT jsonb_object_agg(key, response) FROM {t["input"]}
            WHERE task_id = claimed.id AND state = %s
        ) FROM claimed
    """
    params = [worker, lease, task_id, TaskStatus.WORKING, now, now, worker_actor(worker), InputRequestState.ANSWERED]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    answers = row[-1]
    if isinstance(answers, str):
        answers = json.loads(answers)
    return Run(Task.objects.from_row(names, row[:-1]), answers or {})


def _finish_run_sql(task_id: str, *, to: str, worker: str, fields: Mapping[str, Any]) -> bool:
    """``working`` -> ``to`` while ``worker`` holds the lease."""
    names, columns = _task_columns()
    t = _tables()
    now = timezone.now()
    assignments = ", ".join(f"{connection.ops.quote_name(Task._meta.get_field(f).column)} = %s" for f in fields)
    values = [_db_value(Task, name, value) for name, value in fields.items()]
    actor = worker_actor(worker)
    sql = f"""
        WITH finished AS (
            UPDATE {t["task"]} SET status = %s, updated_at = %s, {assignments}
            WHERE id = %s AND status = %s AND lease_owner = %s
            RETURNING {columns}
        ), recorded AS (
            INSERT INTO {t["event"]} (task_id, at, kind, from_status, to_status, actor, detail)
            SELECT id, %s, 'transition', %s, status, %s, %s FROM finished
        )
        SELECT * FROM finished
    """
    params = [to, now, *values, task_id, TaskStatus.WORKING, worker, now, TaskStatus.WORKING, actor]
    params.append(_db_value(TaskEvent, "detail", {}))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    task = Task.objects.from_row(names, row)
    _after_commit(task_id, TaskStatus.WORKING, to, actor, "transition", task=task)
    return True


# Maintenance -------------------------------------------------------------------


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
                    {"code": -32603, "message": f"Task abandoned: its worker was lost {attempts} times."},
                    actor=SYSTEM,
                    # Only while still stuck: a run that renewed its lease meanwhile is alive.
                    only_if=Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True),
                )
            continue
        report.redispatched += 1
        if dry_run:
            continue
        with transaction.atomic():
            # Guarded: only if it is still the stuck run we saw.
            moved = (
                Task.objects.filter(pk=task_id, status=TaskStatus.WORKING)
                .filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
                .update(lease_owner="", lease_expires_at=None, dispatched_at=now)
            )
            if moved:
                _record(task_id, "redispatched", SYSTEM, now=now, detail={"attempts": attempts})
                transaction.on_commit(lambda tid=task_id: dispatch.enqueue_run(tid))
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
        TaskEvent.objects.filter(task_id__in=[c[0] for c in candidates], kind__in=("run_started", "redispatched"))
        .order_by("at", "id")
        .values_list("task_id", "kind")
    )
    for task_id, kind in events:
        since_run[task_id] = 0 if kind == "run_started" else since_run.get(task_id, 0) + 1
    due: list[tuple[str, int]] = []
    for task_id, attempts, dispatched_at in candidates:
        factor = min(2 ** since_run.get(task_id, 0), REDISPATCH_BACKOFF_MAX_FACTOR)
        if dispatched_at is None or dispatched_at < now - timedelta(seconds=grace * factor):
            due.append((task_id, attempts))
            if len(due) == limit:
                break
    return due


def purge_expired(*, batch_size: int | None = None, dry_run: bool = False, max_batches: int | None = None) -> int:
    """Delete terminal tasks past their TTL, a batch at a time so that polls
    never wait on a long delete. A running task is never expired."""
    size = batch_size or settings.PURGE_BATCH_SIZE
    expired = Task.objects.filter(status__in=TERMINAL_STATUSES, expires_at__lt=timezone.now())
    if dry_run:
        return expired.count()
    delete_batch = _delete_expired_batch_sql if connection.vendor == "postgresql" else _delete_expired_batch_orm
    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic():
            deleted = delete_batch(expired, size)
        if not deleted:
            break
        total += deleted
        batches += 1
        if deleted == size and settings.PURGE_PAUSE_SECONDS:
            time.sleep(settings.PURGE_PAUSE_SECONDS)
    return total


def _delete_expired_batch_orm(expired: Any, size: int) -> int:
    ids = list(expired.order_by("expires_at").values_list("id", flat=True)[:size])
    if not ids:
        return 0
    InputRequest.objects.filter(task_id__in=ids).delete()
    TaskEvent.objects.filter(task_id__in=ids).delete()
    return Task.objects.filter(pk__in=ids, status__in=TERMINAL_STATUSES).delete()[1].get("mcptasks.Task", 0)


def _delete_expired_batch_sql(expired: Any, size: int) -> int:
    """One statement: the batch's rows and every row that refers to them.

    Django's delete collector would first load each doomed task, with its
    arguments and result, to cascade in Python. Rows some other transaction
    holds (an outcome being marked read) are skipped, not waited for.
    """
    doomed_sql, params = expired.order_by("expires_at").values("pk")[:size].query.sql_with_params()
    quote = connection.ops.quote_name
    task_table = quote(Task._meta.db_table)
    referrers = [
        (quote(rel.related_model._meta.db_table), quote(rel.field.column))
        for rel in Task._meta.related_objects
        if rel.on_delete is models.CASCADE
    ]
    deletes = "".join(
        f", gone_{n} AS (DELETE FROM {table} WHERE {column} IN (SELECT pk FROM doomed))"
        for n, (table, column) in enumerate(referrers)
    )
    sql = (
        f"WITH doomed AS ({doomed_sql} FOR UPDATE SKIP LOCKED){deletes} "
        f"DELETE FROM {task_table} WHERE {quote(Task._meta.pk.column)} IN (SELECT pk FROM doomed)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def expire_now(task_id: str, *, actor: str) -> bool:
    """Make a terminal task purgeable at once (an active one is cancelled first)."""
    now = timezone.now()
    with transaction.atomic():
        status = Task.objects.select_for_update().filter(pk=task_id).values_list("status", flat=True).first()
        if status is None:
            return False
        if status in ACTIVE_STATUSES:
            _cancel(task_id, actor=actor, reason="The task was expired by an operator.")
        Task.objects.filter(pk=task_id, status__in=TERMINAL_STATUSES).update(expires_at=now)
        _record(task_id, "expired", actor, now=now)
        return True


# Operators and audit --------------------------------------------------------------

#: Reads of finished tasks (the spec's "retrieval" audit), one line per read.
audit_logger = logging.getLogger("mcptasks.audit")

RETRYABLE_STATUSES = (TaskStatus.FAILED, TaskStatus.CANCELLED)


def retry_refusal(task: Task) -> str | None:
    """Why ``task`` may not be retried, or ``None`` when it may.

    A retry never touches the old row (terminal is final): it starts a new
    task with the same tool, arguments and owner. That is safe only when the
    work cannot end up done twice: the old task ended without doing it
    (``failed`` or ``cancelled``; a ``completed`` task did its work), and the
    tool declares that running it again is harmless (MCP tool annotations
    ``readOnlyHint`` or ``idempotentHint``). A tool run may have been cut off
    half way; only such a tool can be started over blindly.
    """
    if task.status not in RETRYABLE_STATUSES:
        return f"it is {task.status}"
    tool = registry.get(task.tool_name)
    if tool is None:
        return f"tool {task.tool_name!r} is no longer offered"
    hints = tool.annotations or {}
    if not (hints.get("readOnlyHint") or hints.get("idempotentHint")):
        return f"tool {task.tool_name!r} is not marked read-only or idempotent"
    return None


def retry(task_id: str, *, actor: str) -> Task | None:
    """Start a new task that repeats a failed or cancelled one.

    Returns the new task, or ``None`` when the old one may not be retried
    (see ``retry_refusal``) or was retried already: each task is retried at
    most once, so a double click starts one run. The old task gets a
    ``retried`` event naming the new id, the new one a ``retry_of`` event
    naming the old; both by ``actor``. The new task belongs to the old one's
    owner and is enqueued after commit.
    """
    with transaction.atomic():
        old = Task.objects.select_for_update().filter(pk=task_id).first()
        if old is None or retry_refusal(old) is not None:
            return None
        if TaskEvent.objects.filter(task_id=task_id, kind="retried").exists():
            return None
        new = create_task(
            owner=old.owner,
            tool_name=old.tool_name,
            arguments=old.arguments,
            era=old.era,
            client_capabilities=old.client_capabilities,
            ttl_ms=old.ttl_ms,
            poll_interval_ms=old.poll_interval_ms,
        )
        now = timezone.now()
        _record(old.id, "retried", actor, now=now, detail={"new_task_id": new.id})
        _record(new.id, "retry_of", actor, now=now, detail={"task_id": old.id})
        transaction.on_commit(
            lambda: logger.info(
                "task %s retried as %s by %s",
                old.id,
                new.id,
                actor,
                extra={"task_id": old.id, "kind": "retried", "new_task_id": new.id, "actor": actor},
            )
        )
    return new


def note_result_retrieved(task: Task, *, actor: str) -> bool:
    """Audit a read of a finished task's outcome (its result or error).

    Every such read is logged on ``mcptasks.audit``; the first is also
    recorded as a ``result_retrieved`` event, guarded by the task's
    ``outcome_read_at`` (set once). Reads of unfinished tasks (the polling hot
    path) cost nothing, and later reads of a finished one cost nothing either:
    the row read for the answer carries the mark. Returns whether an event
    was written.
    """
    if task.status not in TERMINAL_STATUSES:
        return False
    audit_logger.info(
        "task %s %s result retrieved by %s",
        task.id,
        task.status,
        actor,
        extra={
            "task_id": task.id,
            "kind": "result_retrieved",
            "status": task.status,
            "tool": task.tool_name,
            "owner": task.owner,
            "actor": actor,
        },
    )
    if task.outcome_read_at is not None:
        return False
    now = timezone.now()
    with transaction.atomic():
        first = Task.objects.filter(pk=task.id, status__in=TERMINAL_STATUSES, outcome_read_at__isnull=True).update(
            outcome_read_at=now
        )
        if first:
            _record(task.id, "result_retrieved", actor, now=now, detail={"status": task.status})
    task.outcome_read_at = now
    return bool(first)
