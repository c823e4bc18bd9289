"""Sessions of the 2025-era wire, and what ties legacy tasks to them.

A session is a durable row (``LegacySession``): any web process can serve any
request of it. It belongs to the identity that opened it; for anyone else it
does not exist (404, like an unknown or ended one).

Legacy tasks remember the session that created them (``LegacyTask``), so
that their ``notifications/tasks/status`` reach that session's GET stream:
the receiver below forwards each committed status change of a legacy task to
the session's group on the Channels layer.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from ...errors import InvalidParams
from ...models import ACTIVE_STATUSES, Era, LegacySession, LegacyTask, Task, TaskStatus
from ...notify import fabric as notify
from ...tasks import events
from ..caller import Caller
from ..shapes import change_stamp, iso

#: A session unused for this long is over (its client must initialize again).
SESSION_IDLE_TIMEOUT = timedelta(hours=24)
#: ``last_seen_at`` is written at most this often per session.
TOUCH_EVERY = timedelta(seconds=60)
#: Ended and idle sessions removed per new session (lazy housekeeping).
PRUNE_BATCH = 200

RELATED_TASK = "io.modelcontextprotocol/related-task"


# Groups on the Channels layer -----------------------------------------------------------


def session_group(session_id: str) -> str:
    """The GET stream of a session listens here."""
    return f"mcptasks.session.{_digest(session_id)}"


def call_group(session_id: str, request_id: Any) -> str:
    """One client request of a session (a streamed tools/call or tasks/result):
    the client's answers to our requests, and its cancellation, come here."""
    return f"mcptasks.lcall.{call_token(session_id, request_id)}"


def call_token(session_id: str, request_id: Any) -> str:
    return _digest(f"{session_id}\0{json.dumps(request_id)}")


def _digest(value: str) -> str:
    """Group names are short and plain (``[A-Za-z0-9._-]``, < 100 chars)."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


# Sessions -------------------------------------------------------------------------------


def open_session(
    caller: Caller, protocol_version: str, capabilities: dict[str, Any], client_info: dict[str, Any]
) -> LegacySession:
    now = timezone.now()
    prune_sessions()
    return LegacySession.objects.create(
        owner=caller.owner,
        protocol_version=protocol_version,
        client_capabilities=capabilities,
        client_info=client_info,
        created_at=now,
        last_seen_at=now,
    )


def find_session(session_id: str, caller: Caller) -> LegacySession | None:
    """The caller's open session with this id, or ``None``: unknown, ended,
    idle too long and someone else's are indistinguishable."""
    if not session_id or len(session_id) > 64:
        return None
    cutoff = timezone.now() - SESSION_IDLE_TIMEOUT
    return LegacySession.objects.filter(
        pk=session_id, owner=caller.owner, closed_at__isnull=True, last_seen_at__gte=cutoff
    ).first()


def touch(session: LegacySession) -> None:
    now = timezone.now()
    if now - session.last_seen_at >= TOUCH_EVERY:
        LegacySession.objects.filter(pk=session.pk).update(last_seen_at=now)
        session.last_seen_at = now


def mark_initialized(session: LegacySession) -> None:
    if session.initialized_at is None:
        session.initialized_at = timezone.now()
        LegacySession.objects.filter(pk=session.pk, initialized_at__isnull=True).update(
            initialized_at=session.initialized_at
        )


def close_session(session: LegacySession) -> None:
    """End the session; its GET stream closes. Its tasks live on (they are the
    caller's, and run to the end), but no longer notify anyone."""
    LegacySession.objects.filter(pk=session.pk, closed_at__isnull=True).update(closed_at=timezone.now())
    notify.publisher.publish(session_group(session.pk), {"closed": True})


def prune_sessions(limit: int = PRUNE_BATCH) -> int:
    """Delete sessions ended over an hour ago, or idle past the timeout."""
    now = timezone.now()
    stale = LegacySession.objects.filter(
        Q(closed_at__lt=now - timedelta(hours=1)) | Q(last_seen_at__lt=now - SESSION_IDLE_TIMEOUT)
    )
    ids = list(stale.values_list("pk", flat=True)[:limit])
    if not ids:
        return 0
    return LegacySession.objects.filter(pk__in=ids).delete()[0]


# Tasks ------------------------------------------------------------------------------------


def visible_tasks(caller: Caller, session: LegacySession) -> QuerySet[Task]:
    """The legacy tasks this caller may see from this session.

    Bound to the caller's identity; an anonymous caller has none that other
    anonymous callers share, so its tasks are bound to its session instead.
    Finished tasks past their TTL are gone, even before the prune removes them.
    """
    qs = Task.objects.filter(owner=caller.owner, era=Era.LEGACY)
    if not caller.authenticated:
        qs = qs.filter(legacy__session_id=session.pk)
    return qs.filter(Q(status__in=ACTIVE_STATUSES) | Q(expires_at__isnull=True) | Q(expires_at__gte=timezone.now()))


#: The longest ``progressToken`` kept with a task (characters).
MAX_PROGRESS_TOKEN = 256


def progress_token(meta: dict[str, Any]) -> str | int | None:
    """The request's ``_meta.progressToken``, bounded before it is kept:
    a string or an integer (the schema's ``ProgressToken``), else -32602."""
    token = meta.get("progressToken")
    if token is None:
        return None
    if isinstance(token, str) and len(token) <= MAX_PROGRESS_TOKEN:
        return token
    if isinstance(token, int) and not isinstance(token, bool) and -(2**63) <= token < 2**63:
        return token
    raise InvalidParams(
        f'"_meta.progressToken" must be a string of at most {MAX_PROGRESS_TOKEN} characters or an integer'
    )


def link_task(task: Task, session: LegacySession, *, token: str | int | None = None) -> None:
    """Tie a new task to its session, with its request's ``progressToken``."""
    LegacyTask.objects.create(task=task, session_id=session.pk, progress_token=token)


def task_object(task: Task) -> dict[str, Any]:
    """The 2025-11-25 ``Task``: what tasks/get, tasks/list, tasks/cancel, the
    CreateTaskResult and ``notifications/tasks/status`` carry."""
    data: dict[str, Any] = {
        "taskId": task.id,
        "status": task.status,
        "createdAt": iso(task.created_at),
        "lastUpdatedAt": iso(task.updated_at),
        "ttl": task.ttl_ms,
        "pollInterval": task.poll_interval_ms,
    }
    message = task.status_message or _failure_summary(task)
    if message:
        data["statusMessage"] = message
    return data


def _failure_summary(task: Task) -> str:
    """A failed task says why (the spec asks for a diagnostic statusMessage)."""
    if task.status != TaskStatus.FAILED:
        return ""
    if task.error:
        return str(task.error.get("message", ""))
    for block in (task.result or {}).get("content") or []:
        if isinstance(block, dict) and block.get("type") == "text" and block.get("text"):
            return f"Tool execution failed: {block['text']}"
    return "Tool execution failed."


def related(task_id: str) -> dict[str, Any]:
    return {RELATED_TASK: {"taskId": task_id}}


# Status notifications -----------------------------------------------------------------------


def forward_task_change(
    *,
    task_id: str,
    from_status: str = "",
    to_status: str = "",
    task: Task | None = None,
    progress: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """After commit, wherever a legacy task changes status (web, worker,
    admin): ``notifications/tasks/status`` to its session's GET stream; and
    where its tool reported numbers and its creating request carried a
    ``progressToken``, ``notifications/progress`` under that token."""
    if task is None or task.era != Era.LEGACY:
        return
    if from_status == to_status:
        if progress is not None:
            _forward_progress(task, progress)
        return
    session_id = LegacyTask.objects.filter(task_id=task_id).values_list("session_id", flat=True).first()
    if not session_id or not notify.is_followed(session_group(session_id)):
        return
    notify.publisher.publish(
        session_group(session_id),
        {
            "task_id": task_id,
            "at": change_stamp(task),
            "notification": {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task_object(task)},
        },
    )


def _forward_progress(task: Task, progress: dict[str, Any]) -> None:
    link = LegacyTask.objects.filter(task_id=task.id).values_list("session_id", "progress_token").first()
    if link is None or link[1] is None or not notify.is_followed(session_group(link[0])):
        return
    params = {"progressToken": link[1], **progress, "_meta": related(task.id)}
    notify.publisher.publish(
        session_group(link[0]),
        {
            "task_id": task.id,
            "at": change_stamp(task),
            "notification": {"jsonrpc": "2.0", "method": "notifications/progress", "params": params},
        },
    )


def connect() -> None:
    # A 2025-era task's session is an ORM read: its changes need a thread.
    events.add_publisher(forward_task_change, needs_thread=lambda task: task is not None and task.era == Era.LEGACY)
