"""The guarded transitions: the only code that changes a task's status.

The status rule is ``MOVES`` (which status may move to which), read by
every transition through ``allowed_from``; nothing else decides it. A
terminal status moves nowhere. Every transition is a compare-and-set on the
statuses the rule allows, so a worker finishing while a cancel arrives, or
two answers racing, can never break ``working <-> input_required ->
completed | failed | cancelled``. A move to a terminal status stamps
``finished_at`` and takes the task out of its owner's count (``quota``) in
the same write.

One writer per transition per backend (``sql.single_statement`` chooses,
once per process): on Postgres its named statement in ``queries.sql``
(``run_finish``, ``task_end``, ``input_request``, ``input_answer``), on other
databases its ORM twin in the same function, built on ``_transition``.
docs/architecture.md ("One writer per transition") lists them all. A new
transition follows the pattern: a statement that takes ``allowed_from(to)``,
called here on Postgres, and its twin through ``_transition``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
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
from ..tools.results import is_tool_error
from . import quota, sql
from .dispatch import enqueue_after_commit, loop_sender, route
from .events import EventKind, aannounce_committed, announce, record_event, worker_actor

#: The status rule: the statuses each status may move to. A terminal status
#: is final, so it has no entry.
MOVES: Mapping[str, frozenset[str]] = {
    TaskStatus.WORKING: frozenset(
        {TaskStatus.INPUT_REQUIRED, TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
    TaskStatus.INPUT_REQUIRED: frozenset({TaskStatus.WORKING, TaskStatus.FAILED, TaskStatus.CANCELLED}),
}


def may_move(from_status: str, to_status: str) -> bool:
    """Whether the rule lets a task in ``from_status`` move to ``to_status``."""
    return to_status in MOVES.get(from_status, ())


def allowed_from(to_status: str) -> list[str]:
    """The statuses a task may move to ``to_status`` from (a statement's
    ``from`` parameter, ``_transition``'s guard)."""
    return [str(status) for status in TaskStatus if may_move(status, to_status)]


def _transition(
    task_id: str,
    *,
    to: str,
    actor: str,
    kind: str = EventKind.TRANSITION,
    fields: Mapping[str, Any] | None = None,
    extra_filter: Q | None = None,
    detail: Mapping[str, Any] | None = None,
) -> bool:
    """The ORM twin of the statements: move ``task_id`` to ``to`` if the rule
    allows it from its status. Must run inside ``transaction.atomic``.
    Returns whether it moved."""
    row = Task.objects.select_for_update().filter(pk=task_id).values_list("status", "owner", "tool_name").first()
    if row is None or not may_move(row[0], to):
        return False
    current, owner, tool = row
    now = timezone.now()
    update = Task.objects.filter(pk=task_id, status=current)
    if extra_filter is not None:
        update = update.filter(extra_filter)
    if to in TERMINAL_STATUSES:
        fields = {**(fields or {}), "finished_at": now}
    if not update.update(status=to, updated_at=now, **dict(fields or {})):
        return False
    record_event(task_id, kind, actor, now=now, from_status=current, to_status=to, detail=detail)
    if to in TERMINAL_STATUSES:
        quota.adjust(owner, -1)
    if to in TERMINAL_STATUSES and current == TaskStatus.INPUT_REQUIRED:
        # Questions are pending only while the task waits.
        InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).update(
            state=InputRequestState.WITHDRAWN
        )
    announce(task_id, current, to, actor, kind)
    metrics.task_finished(tool, to, tool_error=bool((fields or {}).get("tool_error")))
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
    return _end_run(task_id, worker=worker, to=to, result=result, error=None, message=message)


def _end_run(task_id: str, *, worker: str, to: str, result: Any, error: dict[str, Any] | None, message: str) -> bool:
    """The run holding the lease ends the task ``to`` (``run_finish``): a
    run holds a lease only while ``working``."""
    actor = worker_actor(worker)
    tool_error = error is None and is_tool_error(result)
    if not sql.single_statement():
        fields: dict[str, Any] = {"status_message": message, "tool_error": tool_error, **_CLEAR_LEASE}
        fields.update({"error": error} if error is not None else {"result": result})
        with transaction.atomic():
            return _transition(task_id, to=to, actor=actor, extra_filter=Q(lease_owner=worker), fields=fields)
    if not may_move(TaskStatus.WORKING, to):
        return False
    params = {
        "task_id": task_id,
        "to": str(to),
        "now": timezone.now(),
        "result": sql.db_value(Task, "result", result),
        "error": sql.db_value(Task, "error", error),
        "message": message,
        "working": TaskStatus.WORKING.value,
        "worker": worker,
        "kind": EventKind.TRANSITION.value,
        "actor": actor,
        "tool_error": tool_error,
    }
    cursor = sql.execute("run_finish", params)
    row = cursor.fetchone()
    if row is None:
        return False
    task = Task.objects.from_row(sql.column_names(cursor), row)
    announce(task_id, TaskStatus.WORKING, to, actor, EventKind.TRANSITION, task=task)
    metrics.task_finished(task.tool_name, to, tool_error=tool_error)
    return True


def fail(
    task_id: str,
    error: dict[str, Any],
    *,
    actor: str,
    worker: str | None = None,
    message: str = "",
    lapsed_at: datetime | None = None,
) -> bool:
    """End the task ``failed`` with a JSON-RPC error. With ``worker``, only
    while that run holds the lease (the run's end); with ``lapsed_at``, only
    while its lease, if any, had lapsed by then (the sweeper's)."""
    message = message or str(error.get("message", ""))
    if worker:
        return _end_run(task_id, worker=worker, to=TaskStatus.FAILED, result=None, error=error, message=message)
    return _end(task_id, TaskStatus.FAILED, actor=actor, message=message, error=error, lapsed_at=lapsed_at)


def cancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """Cancel an active task now (in the caller's transaction, if any). The
    running tool sees it through its context; a queued run that has not
    started finds the task terminal and never runs."""
    return _end(task_id, TaskStatus.CANCELLED, actor=actor, message=reason or "The task was cancelled.")


def _end(
    task_id: str,
    to: str,
    *,
    actor: str,
    message: str,
    error: dict[str, Any] | None = None,
    lapsed_at: datetime | None = None,
) -> bool:
    """An active task ended from outside its run: ``cancelled`` by its
    client or an operator, ``failed`` by the system (``task_end``)."""
    now = timezone.now()
    cancelled = to == TaskStatus.CANCELLED
    if not sql.single_statement():
        fields: dict[str, Any] = {"status_message": message, **_CLEAR_LEASE}
        fields.update({"cancel_requested_at": now, "cancelled_by": actor} if cancelled else {"error": error})
        guard = None if lapsed_at is None else Q(lease_expires_at__lt=lapsed_at) | Q(lease_expires_at__isnull=True)
        with transaction.atomic():
            return _transition(task_id, to=to, actor=actor, fields=fields, extra_filter=guard)
    params = _end_params(task_id, to, now=now, actor=actor, message=message, error=error, lapsed_at=lapsed_at)
    cursor = sql.execute("task_end", params)
    ended = _ended(sql.column_names(cursor), cursor.fetchone(), committed=False)
    if ended is not None:
        task, from_status = ended
        announce(task.id, from_status, task.status, actor, EventKind.TRANSITION, task=task)
    return ended is not None


def _end_params(
    task_id: str,
    to: str,
    *,
    now: datetime,
    actor: str,
    message: str,
    error: dict[str, Any] | None = None,
    lapsed_at: datetime | None = None,
) -> dict[str, Any]:
    cancelled = to == TaskStatus.CANCELLED
    return {
        "task_id": task_id,
        "from": allowed_from(to),
        "to": str(to),
        "now": now,
        "actor": actor,
        "message": message,
        "error": sql.db_value(Task, "error", error),
        "cancelled_at": now if cancelled else None,
        "cancelled_by": actor if cancelled else None,
        "lapsed_at": lapsed_at,
        "kind": EventKind.TRANSITION.value,
        "withdrawn": InputRequestState.WITHDRAWN.value,
        "input_required": TaskStatus.INPUT_REQUIRED.value,
        "pending": InputRequestState.PENDING.value,
    }


async def acancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """``cancel`` on the event loop: the same statement (Postgres), in autocommit."""
    params = _end_params(
        task_id, TaskStatus.CANCELLED, now=timezone.now(), actor=actor, message=reason or "The task was cancelled."
    )
    result = await sql.aexecute("task_end", params)
    ended = _ended(result.names, result.first(), committed=True)
    if ended is not None:
        await aannounce_committed(ended[0], ended[1], actor, EventKind.TRANSITION)
    return ended is not None


def _ended(names: list[str], row: Any, *, committed: bool) -> tuple[Task, str] | None:
    """The row ``task_end`` left and the status it left, counted; ``None`` when nothing moved."""
    if row is None:
        return None
    task = Task.objects.from_row(names[:-1], row[:-1])
    metrics.task_finished(task.tool_name, task.status, committed=committed)
    return task, row[-1]


def request_input(task_id: str, requests: Mapping[str, Mapping[str, Any]], *, worker: str, message: str = "") -> bool:
    """A run needs answers it does not have: record the questions, move the
    task to ``input_required`` and release the worker (``input_request``).

    Keys already recorded keep their original request (a key never changes
    meaning over the task's life).
    """
    message = message or "Waiting for input."
    if not may_move(TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED):
        return False
    if not sql.single_statement():
        return _request_input_orm(task_id, requests, worker=worker, message=message)
    actor = worker_actor(worker)
    asked = {key: {"method": req["method"], "params": req.get("params", {})} for key, req in requests.items()}
    params = {
        "task_id": task_id,
        "now": timezone.now(),
        "worker": worker,
        "message": message,
        "working": TaskStatus.WORKING.value,
        "input_required": TaskStatus.INPUT_REQUIRED.value,
        "pending": InputRequestState.PENDING.value,
        "requests": sql.db_value(InputRequest, "params", asked),
        "kind": EventKind.TRANSITION.value,
        "actor": actor,
        "detail": sql.db_value(TaskEvent, "detail", {"keys": sorted(requests)}),
    }
    cursor = sql.execute("input_request", params)
    row = cursor.fetchone()
    if row is None:
        return False
    task = Task.objects.from_row(sql.column_names(cursor), row)
    announce(task_id, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, actor, EventKind.TRANSITION, task=task)
    return True


def _request_input_orm(task_id: str, requests: Mapping[str, Mapping[str, Any]], *, worker: str, message: str) -> bool:
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
            to=TaskStatus.INPUT_REQUIRED,
            actor=worker_actor(worker),
            extra_filter=Q(lease_owner=worker),
            fields={"status_message": message, "attempts": 0, **_CLEAR_LEASE},
            detail={"keys": sorted(requests)},
        )
        if not moved:
            transaction.set_rollback(True)
        return moved


def submit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """Record answers to outstanding requests; resume the task when none is left.

    Keys that are unknown, already answered or withdrawn are ignored. Returns
    the keys accepted. Answers are applied at most once: each row moves from
    ``pending`` under the task's row lock. All or nothing: one malformed
    answer refuses the whole update (-32602) before any is recorded.
    """
    if not sql.single_statement():
        return _submit_input_orm(task_id, responses, actor=actor)
    with transaction.atomic():
        locked = sql.execute("task_lock", {"task_id": task_id}).fetchone()
        if locked is None:
            return []
        cursor = sql.execute("input_pending", {"task_id": task_id, "pending": InputRequestState.PENDING.value})
        answer = _answer(task_id, locked[0], cursor.fetchall(), responses, actor)
        if answer is None:
            return []
        accepted, resume, _, params = answer
        cursor = sql.execute("input_answer", params)
        task = Task.objects.from_row(sql.column_names(cursor), cursor.fetchone())
        if resume:
            announce(task_id, locked[0], TaskStatus.WORKING, actor, EventKind.TRANSITION, task=task)
            enqueue_after_commit(task_id)
        else:
            announce(task_id, locked[0], locked[0], actor, EventKind.INPUT)
        return accepted


async def asubmit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """``submit_input`` on the event loop (Postgres): the same statements in
    one transaction. Once committed, a resumed task's run is published from
    the loop. The caller checks that a loop sender is installed."""
    async with sql.atransaction() as db:
        locked = (await db.execute("task_lock", {"task_id": task_id})).first()
        if locked is None:
            return []
        pending_state = {"task_id": task_id, "pending": InputRequestState.PENDING.value}
        rows = (await db.execute("input_pending", pending_state)).rows
        answer = _answer(task_id, locked[0], rows, responses, actor)
        if answer is None:
            return []
        accepted, resume, pending, params = answer
        left = await db.execute("input_answer", params)
    task = Task.objects.from_row(left.names, left.first())
    if resume:
        await aannounce_committed(task, locked[0], actor, EventKind.TRANSITION)
        send = loop_sender()
        assert send is not None, "the caller checks that a loop sender is installed"
        await send(task_id, route(task.tool_name))
    else:
        remaining = {key: asked for key, asked in pending.items() if key not in accepted}
        await aannounce_committed(task, locked[0], actor, EventKind.INPUT, pending=remaining)
    return accepted


def _answer(
    task_id: str, status: str, rows: Iterable[Any], responses: Mapping[str, Any], actor: str
) -> tuple[list[str], bool, dict[str, Any], dict[str, Any]] | None:
    """What answers to the pending questions ``rows`` do, under the task's
    lock: the keys accepted (checked, all or nothing), whether the task
    resumes, the questions, and ``input_answer``'s parameters. ``None``
    when nothing is to be written."""
    if status not in ACTIVE_STATUSES:
        return None
    pending = {key: {"method": method, "params": params} for key, method, params in rows}
    accepted = [key for key in pending if key in responses]
    for key in accepted:
        validate_input_response(pending[key]["method"], key, responses[key])
    if not accepted:
        return None
    resume = may_move(status, TaskStatus.WORKING) and len(accepted) == len(pending)
    params = {
        "task_id": task_id,
        "now": timezone.now(),
        "actor": actor,
        "answers": sql.db_value(InputRequest, "response", {key: responses[key] for key in accepted}),
        "answered": InputRequestState.ANSWERED.value,
        "pending": InputRequestState.PENDING.value,
        "resume": resume,
        "working": TaskStatus.WORKING.value,
        "input_required": TaskStatus.INPUT_REQUIRED.value,
        "input": EventKind.INPUT.value,
        "transition": EventKind.TRANSITION.value,
        "detail": sql.db_value(TaskEvent, "detail", {"keys": accepted}),
    }
    return accepted, resume, pending, params


def _submit_input_orm(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    with transaction.atomic():
        status = Task.objects.select_for_update().filter(pk=task_id).values_list("status", flat=True).first()
        pending = InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING)
        answer = _answer(task_id, status or "", pending.values_list("key", "method", "params"), responses, actor)
        if status is None or answer is None:
            return []
        accepted, resume, _, params = answer
        now = params["now"]
        for key in accepted:  # every one still pending: the row lock keeps other writers out
            pending.filter(key=key).update(state=InputRequestState.ANSWERED, response=responses[key], answered_at=now)
        record_event(task_id, EventKind.INPUT, actor, now=now, detail={"keys": accepted})
        if resume:
            _transition(
                task_id, to=TaskStatus.WORKING, actor=actor, fields={"status_message": "", "dispatched_at": now}
            )
            enqueue_after_commit(task_id)
        else:
            # Still waiting on other answers: listeners see the shorter list.
            Task.objects.filter(pk=task_id).update(updated_at=now)
            announce(task_id, status, status, actor, EventKind.INPUT)
        return accepted
