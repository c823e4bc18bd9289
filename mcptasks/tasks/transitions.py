"""The guarded transitions, the only code that changes a task's status: each reads the rule
(``MOVES``) through ``allowed_from`` and hands the store a compare-and-set on those statuses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from ..models import ACTIVE_STATUSES, TaskStatus
from ..tools.context import validate_input_response
from ..tools.results import is_tool_error
from .events import worker_actor
from .store import backend
from .store.orm import Ending

Decision = tuple[list[str], bool, dict[str, Any]]

#: The status rule: the statuses each status may move to (a terminal status has no entry).
MOVES: Mapping[str, frozenset[str]] = {
    TaskStatus.WORKING: frozenset(
        {TaskStatus.INPUT_REQUIRED, TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
    TaskStatus.INPUT_REQUIRED: frozenset({TaskStatus.WORKING, TaskStatus.FAILED, TaskStatus.CANCELLED}),
}


def may_move(from_status: str, to_status: str) -> bool:
    return to_status in MOVES.get(from_status, ())


def allowed_from(to_status: str) -> list[str]:
    """The statuses a task may move to ``to_status`` from (a statement's ``from`` parameter)."""
    return [str(status) for status in TaskStatus if may_move(status, to_status)]


def complete(task_id: str, result: dict[str, Any], *, worker: str, message: str = "") -> bool:
    return finish_run(task_id, result, worker=worker, to=TaskStatus.COMPLETED, message=message)


def finish_run(task_id: str, result: dict[str, Any], *, worker: str, to: str, message: str = "") -> bool:
    """The leased run's result leaves the task ``to`` (``failed`` where the protocol era says so)."""
    if to not in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        raise ValueError(f"a run cannot finish as {to!r}")
    return _end_run(task_id, worker=worker, to=to, result=result, error=None, message=message)


def _end_run(task_id: str, *, worker: str, to: str, result: Any, error: dict[str, Any] | None, message: str) -> bool:
    if not may_move(TaskStatus.WORKING, to):  # a run holds a lease only while working
        return False
    tool_error = error is None and is_tool_error(result)
    ending = Ending(task_id, to, allowed_from(to), worker_actor(worker), message, error, worker, result, tool_error)
    return backend().end_run(ending)


def fail(
    task_id: str, error: dict[str, Any], *, actor: str, worker: str | None = None, lapsed_at: datetime | None = None
) -> bool:
    """End the task ``failed``: with ``worker``, only under its lease; with ``lapsed_at``, once its lease lapsed."""
    to, message = TaskStatus.FAILED, str(error.get("message", ""))
    if worker:
        return _end_run(task_id, worker=worker, to=to, result=None, error=error, message=message)
    return backend().end(Ending(task_id, to, allowed_from(to), actor, message, error, lapsed_at=lapsed_at))


_CANCELLED = "The task was cancelled."


def cancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    """Cancel an active task now (in the caller's transaction, if any); a queued run then never starts."""
    to = TaskStatus.CANCELLED
    return backend().end(Ending(task_id, to, allowed_from(to), actor, reason or _CANCELLED))


async def acancel(task_id: str, *, actor: str, reason: str = "") -> bool:
    to = TaskStatus.CANCELLED
    return await backend().aend(Ending(task_id, to, allowed_from(to), actor, reason or _CANCELLED))


def request_input(task_id: str, requests: Mapping[str, Mapping[str, Any]], *, worker: str, message: str = "") -> bool:
    """Record a run's questions (a key keeps its first request), move the task to ``input_required``."""
    to, message = TaskStatus.INPUT_REQUIRED, message or "Waiting for input."
    if not may_move(TaskStatus.WORKING, to):
        return False
    return backend().request_input(
        task_id, requests, allowed=allowed_from(to), worker=worker, actor=worker_actor(worker), message=message
    )


def submit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    """Record answers to pending requests, at most once each, all or nothing (-32602 for one malformed);
    resume the task when none is left. The keys accepted (unknown, answered or withdrawn ones are ignored)."""
    return backend().submit_input(task_id, responses, actor=actor, decide=partial(_decide, responses))


async def asubmit_input(task_id: str, responses: Mapping[str, Any], *, actor: str) -> list[str]:
    return await backend().asubmit_input(task_id, responses, actor=actor, decide=partial(_decide, responses))


def _decide(responses: Mapping[str, Any], status: str, rows: Iterable[Any]) -> Decision | None:
    """Under the task's lock, given its status and pending questions (key, method, params):
    the keys accepted, whether it resumes, and the questions; ``None`` when nothing is to be written."""
    if status not in ACTIVE_STATUSES:
        return None
    pending = {key: {"method": method, "params": params} for key, method, params in rows}
    accepted = [key for key in pending if key in responses]
    for key in accepted:
        validate_input_response(pending[key]["method"], key, responses[key])
    if not accepted:
        return None
    return accepted, may_move(status, TaskStatus.WORKING) and len(accepted) == len(pending), pending
