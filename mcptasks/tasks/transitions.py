"""The guarded transitions: the only code that changes a task's status.

Every transition is a compare-and-set: it names the statuses it may start from,
locks the row (Postgres), and updates it only if the status is still one of
them. A terminal status is final. So a worker finishing while a cancel arrives,
or two answers racing, can never break ``working <-> input_required ->
completed | failed | cancelled``. A move to a terminal status stamps
``finished_at`` in the same write. A run's finish on Postgres is one statement
(``_finish_run_sql``) beside its ORM twin (``_transition``). A move from an
active status to a terminal one takes the task out of its owner's count
(``quota``) in the same statement or transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    InputRequest,
    InputRequestState,
    Task,
    TaskEvent,
    TaskStatus,
)
from ..telemetry import metrics
from ..tools.context import validate_input_response
from . import quota, sql
from .dispatch import enqueue_after_commit, loop_sender
from .events import EventKind, aannounce_committed, announce, record_event, worker_actor


def _transition(
    task_id: str,
    *,
    allowed_from: Iterable[str],
    to: str,
    actor: str,
    kind: str = EventKind.TRANSITION,
    fields: Mapping[str, Any] | None = None,
    extra_filter: Q | None = None,
    detail: Mapping[str, Any] | None = None,
) -> bool:
    """Move ``task_id`` to ``to`` if its status is in ``allowed_from``.

    Must run inside ``transaction.atomic``. Returns whether it moved.
    """
    allowed = tuple(allowed_from)
    qs = Task.objects.select_for_update().filter(pk=task_id)
    row = qs.values_list("status", "owner", "tool_name").first()
    if row is None or row[0] not in allowed:
        return False
    current, owner, tool = row
    now = timezone.now()
    update = Task.objects.filter(pk=task_id, status=current)
    if extra_filter is not None:
        update = update.filter(extra_filter)
    if to in TERMINAL_STATUSES:
        fields = {**(fields or {}), "finished_at": now}
    changed = update.update(status=to, updated_at=now, **dict(fields or {}))
    if not changed:
        return False
    record_event(task_id, kind, actor, now=now, from_status=current, to_status=to, detail=detail)
    if to in TERMINAL_STATUSES and current in ACTIVE_STATUSES:
        quota.adjust(owner, -1)
    if to in TERMINAL_STATUSES and current == TaskStatus.INPUT_REQUIRED:
        # Questions are pending only while the task waits (request_input
        # records them in the same transaction as the move to input_required).
        InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).update(
            state=InputRequestState.WITHDRAWN
        )
    announce(task_id, current, to, actor, kind)
    metrics.task_finished(tool, to)
    return True


_CLEAR_LEASE = {"lease_owner": "", "lease_expires_at": None}


def complete(task_id: str, result: dict[str, Any], *, worker: str, message: str = "") -> bool:
    """The run finished with a result: the task is ``completed``."""
    return finish_run(task_id, result, worker=worker, to=TaskStatus.COMPLETED, message=message)


def finish_run(task_id: str, result: dict[str, Any], *, worker: str, to: str, message: str = "") -> bool:
    """The run finished with a result, which leaves the task ``to``
    (``completed``, or ``failed`` where the protocol era says so; see
    ``mcptasks.protocol.eras``). The result is kept either way. Only the run
    holding the lease may finish the task, so a run that lost its lease
    cannot overwrite another's.
    """
    if to not in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        raise ValueError(f"a run cannot finish as {to!r}")
    fields = {"result": result, "status_message": message, **_CLEAR_LEASE}
    if sql.single_statement():
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


def _finish_run_sql(task_id: str, *, to: str, worker: str, fields: Mapping[str, Any]) -> bool:
    """``working`` -> ``to`` while ``worker`` holds the lease (``run_finish``)."""
    actor = worker_actor(worker)
    params = {
        "task_id": task_id,
        "to": str(to),
        "now": timezone.now(),
        "result": sql.db_value(Task, "result", fields["result"]),
        "message": fields["status_message"],
        "working": TaskStatus.WORKING.value,
        "worker": worker,
        "kind": EventKind.TRANSITION.value,
        "actor": actor,
    }
    cursor = sql.execute("run_finish", params)
    row = cursor.fetchone()
    if row is None:
        return False
    task = Task.objects.from_row(sql.column_names(cursor), row)
    announce(task_id, TaskStatus.WORKING, to, actor, EventKind.TRANSITION, task=task)
    metrics.task_finished(task.tool_name, to)
    return True


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
    a queued run that has not started finds the task terminal and never runs.
    On Postgres one statement (``task_cancel``), also on the event loop
    (``acancel``)."""
    reason = reason or "The task was cancelled."
    if sql.single_statement():
        cursor = sql.execute("task_cancel", _cancel_params(task_id, actor, reason))
        cancelled = _cancelled(sql.column_names(cursor), cursor.fetchone(), committed=False)
        if cancelled is not None:
            task, from_status = cancelled
            announce(task.id, from_status, TaskStatus.CANCELLED, actor, EventKind.TRANSITION, task=task)
        return cancelled is not None
    with transaction.atomic():
        return cancel_in_transaction(task_id, actor=actor, reason=reason)


async def acancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """``cancel`` on the event loop (Postgres; in autocommit)."""
    result = await sql.aexecute("task_cancel", _cancel_params(task_id, actor, reason or "The task was cancelled."))
    cancelled = _cancelled(result.names, result.first(), committed=True)
    if cancelled is not None:
        await aannounce_committed(cancelled[0], cancelled[1], actor, EventKind.TRANSITION)
    return cancelled is not None


def _cancel_params(task_id: str, actor: str, reason: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "active": sql.strings(ACTIVE_STATUSES),
        "cancelled": TaskStatus.CANCELLED.value,
        "now": timezone.now(),
        "actor": actor,
        "reason": reason,
        "kind": EventKind.TRANSITION.value,
        "withdrawn": InputRequestState.WITHDRAWN.value,
        "input_required": TaskStatus.INPUT_REQUIRED.value,
        "pending": InputRequestState.PENDING.value,
    }


def _cancelled(names: list[str], row: Any, *, committed: bool) -> tuple[Task, str] | None:
    """The row ``task_cancel`` left and the status it left, counted; ``None`` when nothing moved."""
    if row is None:
        return None
    task = Task.objects.from_row(names[:-1], row[:-1])
    metrics.task_finished(task.tool_name, TaskStatus.CANCELLED, committed=committed)
    return task, row[-1]


def cancel_in_transaction(task_id: str, *, actor: str, reason: str) -> bool:
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
        record_event(task_id, EventKind.INPUT, actor, now=now, detail={"keys": accepted})
        if status == TaskStatus.INPUT_REQUIRED and not pending.exists():
            _transition(
                task_id,
                allowed_from=[TaskStatus.INPUT_REQUIRED],
                to=TaskStatus.WORKING,
                actor=actor,
                fields={"status_message": "", "dispatched_at": now},
            )
            enqueue_after_commit(task_id)
        else:
            # Still waiting on other answers: listeners see the shorter list.
            Task.objects.filter(pk=task_id).update(updated_at=now)
            announce(task_id, status, status, actor, EventKind.INPUT)
        return accepted


async def asubmit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """``submit_input`` on the event loop (Postgres), the same steps in one
    transaction: the task's row locked (``task_lock``), its pending questions
    read afresh under the lock (``input_pending``), the answers checked, then
    recorded with the task resumed or touched (``input_answer``). Once
    committed, a resumed task's run is published from the loop. The caller
    checks that a loop sender is installed."""
    now = timezone.now()
    async with sql.atransaction() as db:
        locked = (await db.execute("task_lock", {"task_id": task_id})).first()
        if locked is None or locked[0] not in ACTIVE_STATUSES:
            return []
        status = locked[0]
        pending_state = InputRequestState.PENDING.value
        pending = {
            key: {"method": method, "params": params}
            for key, method, params in (
                await db.execute("input_pending", {"task_id": task_id, "pending": pending_state})
            ).rows
        }
        accepted = [key for key in pending if key in responses]
        for key in accepted:  # all or nothing, as on a thread
            validate_input_response(pending[key]["method"], key, responses[key])
        if not accepted:
            return accepted
        resume = status == TaskStatus.INPUT_REQUIRED and len(accepted) == len(pending)
        left = await db.execute(
            "input_answer",
            {
                "task_id": task_id,
                "now": now,
                "actor": actor,
                "answers": sql.db_value(InputRequest, "response", {key: responses[key] for key in accepted}),
                "answered": InputRequestState.ANSWERED.value,
                "pending": pending_state,
                "resume": resume,
                "working": TaskStatus.WORKING.value,
                "input_required": TaskStatus.INPUT_REQUIRED.value,
                "input": EventKind.INPUT.value,
                "transition": EventKind.TRANSITION.value,
                "detail": sql.db_value(TaskEvent, "detail", {"keys": accepted}),
            },
        )
    task = Task.objects.from_row(left.names, left.first())
    if resume:
        await aannounce_committed(task, status, actor, EventKind.TRANSITION)
        send = loop_sender()
        assert send is not None, "the caller checks that a loop sender is installed"
        await send(task_id)
    else:
        remaining = {key: asked for key, asked in pending.items() if key not in accepted}
        await aannounce_committed(task, status, actor, EventKind.INPUT, pending=remaining)
    return accepted
