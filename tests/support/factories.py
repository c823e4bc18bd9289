"""Building tasks in given states through the real lifecycle functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mcptasks.models import TERMINAL_STATUSES, Task, TaskEvent
from mcptasks.tasks import lifecycle

WORKER = "test-host:1:worker"


def elicit(message: str = "Sure?", prop: str = "confirm") -> dict[str, Any]:
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {"type": "object", "properties": {prop: {"type": "boolean"}}},
        },
    }


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


def make_task(owner: str = "alice", tool: str = "slow_compute", arguments: Mapping[str, Any] | None = None, **kw: Any):
    return lifecycle.create_task(owner=owner, tool_name=tool, arguments=dict(arguments or {}), enqueue=False, **kw)


def running_task(worker: str = WORKER, **kw: Any) -> Task:
    """A ``working`` task whose run ``worker`` holds the lease of."""
    task = make_task(**kw)
    claimed = lifecycle.claim(task.id, worker=worker)
    assert claimed is not None
    return claimed


def waiting_task(keys: Iterable[str] = ("first", "second"), worker: str = WORKER, **kw: Any) -> Task:
    """An ``input_required`` task with one pending elicitation per key."""
    task = running_task(worker=worker, **kw)
    assert lifecycle.request_input(task.id, {key: elicit(key) for key in keys}, worker=worker)
    return Task.objects.get(pk=task.id)


def completed_task(**kw: Any) -> Task:
    task = running_task(**kw)
    assert lifecycle.complete(task.id, {"content": [], "isError": False}, worker=WORKER)
    return Task.objects.get(pk=task.id)


def failed_task(**kw: Any) -> Task:
    task = running_task(**kw)
    assert lifecycle.fail(task.id, {"code": -32603, "message": "boom"}, actor="system")
    return Task.objects.get(pk=task.id)


def cancelled_task(**kw: Any) -> Task:
    task = running_task(**kw)
    assert lifecycle.cancel(task.id, actor="client:alice")
    return Task.objects.get(pk=task.id)


def transitions(task_id: str) -> list[tuple[str, str]]:
    """Every status change recorded for the task, in order (creation included)."""
    rows = TaskEvent.objects.filter(task_id=task_id).exclude(to_status="").order_by("at", "id")
    return [(e.from_status, e.to_status) for e in rows]


def terminal_transitions(task_id: str) -> list[tuple[str, str]]:
    return [t for t in transitions(task_id) if t[1] in TERMINAL_STATUSES]
