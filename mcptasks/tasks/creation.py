"""Creating a task within its owner's quota of active tasks: the process's
store counts it, inserts it, its answers and its ``created`` event in one step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Required, TypedDict, Unpack

from django.db import transaction
from django.utils import timezone

from ..conf import settings
from ..models import Era, Task, TaskStatus
from ..telemetry import metrics, tracing
from .dispatch import enqueue_after_commit
from .events import EventKind, announce, client_actor, send_created
from .store import backend


def clamp_ttl(requested_ms: int | None, tool_default_ms: int | None = None) -> int:
    """The request's TTL, else the tool's, else the site's default; never above ``MAX_TTL_MS``."""
    ttl = requested_ms if requested_ms is not None else tool_default_ms
    ttl = settings.DEFAULT_TTL_MS if ttl is None else ttl
    return max(0, min(int(ttl), int(settings.MAX_TTL_MS)))


@dataclass(frozen=True)
class Answer:
    """An input request answered before the task existed (MRTR phase)."""

    method: str
    params: dict[str, Any]
    response: dict[str, Any]


class NewTask(TypedDict, total=False):
    """A task as ``create_task`` is asked for it; the rest is the site's defaults."""

    owner: Required[str]
    tool_name: Required[str]
    arguments: Required[dict[str, Any]]
    era: str
    client_capabilities: dict[str, Any] | None
    ttl_ms: int | None
    poll_interval_ms: int | None


def create_task(
    *, answered: Mapping[str, Answer] | None = None, enqueue: bool = True, **fields: Unpack[NewTask]
) -> Task:
    """Insert a ``working`` task (in its own transaction, or the caller's) and enqueue its run after commit."""
    task, actor, detail = _new_task(fields, enqueue)
    backend().insert_created(task, actor, detail, answered or {})
    transaction.on_commit(lambda: send_created(task))
    announce(task.id, "", TaskStatus.WORKING, actor, EventKind.CREATED, task=task)
    metrics.task_created(task.tool_name)
    if enqueue:
        enqueue_after_commit(task.id, task.tool_name)
    return task


def _new_task(fields: NewTask, enqueue: bool) -> tuple[Task, str, dict[str, Any]]:
    """A new ``working`` task (not saved), its creator and its event's detail."""
    now = timezone.now()
    ttl = clamp_ttl(fields.get("ttl_ms"))
    task = Task(
        owner=fields["owner"],
        tool_name=fields["tool_name"],
        arguments=fields["arguments"],
        era=fields.get("era", Era.MODERN),
        client_capabilities=fields.get("client_capabilities") or {},
        status=TaskStatus.WORKING,
        created_at=now,
        updated_at=now,
        ttl_ms=ttl,
        expires_at=now + timedelta(milliseconds=ttl),
        poll_interval_ms=fields.get("poll_interval_ms") or settings.POLL_INTERVAL_MS,
        dispatched_at=now if enqueue else None,
        trace_context=tracing.carrier() or None,
    )
    return task, client_actor(task.owner), {"tool": task.tool_name, "era": task.era}


async def acreate_task(**fields: Unpack[NewTask]) -> Task | None:
    """``create_task`` of a task on the event loop (the store's ``acreate``); ``None``, having
    done nothing, near the owner's quota: the caller then takes ``create_task`` on a thread."""
    task, actor, detail = _new_task(fields, enqueue=True)
    return await backend().acreate(task, actor, detail, lambda: create_task(**fields))
