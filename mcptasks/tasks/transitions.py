"""The guarded transitions: the only code that changes a task's status.

The status rule is ``MOVES`` (which status may move to which), read by
every transition through ``allowed_from``; nothing else decides it. A
terminal status moves nowhere. Every transition is a compare-and-set on the
statuses the rule allows, so a worker finishing while a cancel arrives, or
two answers racing, can never break ``working <-> input_required ->
completed | failed | cancelled``. A move to a terminal status stamps
``finished_at`` and takes the task out of its owner's count (``quota``) in
the same write.

One writer per transition per backend: each function here applies the rule
and hands the write to the process's store (``store.backend()``): on
Postgres its named statement in ``queries.sql`` (``run_finish``,
``task_end``, ``input_request``, ``input_answer``), elsewhere the ORM's
compare-and-set (``store.orm._transition``). docs/architecture.md ("One
writer per transition") lists them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ..models import ACTIVE_STATUSES, TaskStatus
from ..tools.context import validate_input_response
from ..tools.results import is_tool_error
from .events import worker_actor
from .store import backend
from .store.orm import Decide

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
    ``from`` parameter, the ORM store's guard)."""
    return [str(status) for status in TaskStatus if may_move(status, to_status)]


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
    """The run holding the lease ends the task ``to``: a run holds a lease
    only while ``working``."""
    if not may_move(TaskStatus.WORKING, to):
        return False
    return backend().end_run(
        task_id,
        to=to,
        allowed=allowed_from(to),
        worker=worker,
        actor=worker_actor(worker),
        result=result,
        error=error,
        message=message,
        tool_error=error is None and is_tool_error(result),
    )


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
    to = TaskStatus.FAILED
    return backend().end(
        task_id, to, allowed=allowed_from(to), actor=actor, message=message, error=error, lapsed_at=lapsed_at
    )


def cancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """Cancel an active task now (in the caller's transaction, if any). The
    running tool sees it through its context; a queued run that has not
    started finds the task terminal and never runs."""
    to = TaskStatus.CANCELLED
    return backend().end(
        task_id, to, allowed=allowed_from(to), actor=actor, message=reason or "The task was cancelled."
    )


async def acancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """``cancel`` awaited: on Postgres the same statement on the event loop,
    in autocommit; elsewhere ``cancel`` on a thread."""
    to = TaskStatus.CANCELLED
    message = reason or "The task was cancelled."
    return await backend().aend(task_id, to, allowed=allowed_from(to), actor=actor, message=message)


def request_input(task_id: str, requests: Mapping[str, Mapping[str, Any]], *, worker: str, message: str = "") -> bool:
    """A run needs answers it does not have: record the questions, move the
    task to ``input_required`` and release the worker.

    Keys already recorded keep their original request (a key never changes
    meaning over the task's life).
    """
    to = TaskStatus.INPUT_REQUIRED
    if not may_move(TaskStatus.WORKING, to):
        return False
    return backend().request_input(
        task_id,
        requests,
        allowed=allowed_from(to),
        worker=worker,
        actor=worker_actor(worker),
        message=message or "Waiting for input.",
    )


def submit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """Record answers to outstanding requests; resume the task when none is left.

    Keys that are unknown, already answered or withdrawn are ignored. Returns
    the keys accepted. Answers are applied at most once: each row moves from
    ``pending`` under the task's row lock. All or nothing: one malformed
    answer refuses the whole update (-32602) before any is recorded.
    """
    return backend().submit_input(task_id, responses, actor=actor, decide=_decider(responses))


async def asubmit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """``submit_input`` awaited: on Postgres the same statements on the event
    loop, in one transaction, and a resumed task's run published from the
    loop (the caller checks that a loop sender is installed); elsewhere
    ``submit_input`` on a thread."""
    return await backend().asubmit_input(task_id, responses, actor=actor, decide=_decider(responses))


def _decider(responses: Mapping[str, Any]) -> Decide:
    """What answers do to the pending questions ``rows`` (key, method,
    params) of a task in ``status``, under its lock: the keys accepted
    (checked, all or nothing), whether the task resumes, and the questions;
    ``None`` when nothing is to be written."""

    def decide(status: str, rows: Iterable[Any]) -> tuple[list[str], bool, dict[str, Any]] | None:
        if status not in ACTIVE_STATUSES:
            return None
        pending = {key: {"method": method, "params": params} for key, method, params in rows}
        accepted = [key for key in pending if key in responses]
        for key in accepted:
            validate_input_response(pending[key]["method"], key, responses[key])
        if not accepted:
            return None
        return accepted, may_move(status, TaskStatus.WORKING) and len(accepted) == len(pending), pending

    return decide
