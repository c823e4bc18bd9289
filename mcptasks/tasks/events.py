"""What every change leaves behind: its ``TaskEvent`` row, and once committed
a ``signals.task_changed`` and a structured log line (on the ``mcptasks.lifecycle`` logger).
Actors are named here too.

The signals' receivers are site code: they run on a thread, after the
commit, once per event, whatever path made the change. A change committed on
a thread sends them there, from ``transaction.on_commit``; one committed on
the event loop awaits them on a thread (``aannounce_committed``), never on
the loop, where the ORM raises. A receiver that raises is logged and the
others still run: the change is committed, and its request is answered as
such. The app's own publishers (:func:`add_publisher`) are called after the
receivers, with the same arguments; each says which changes it needs a
thread for, so a change no site code hears takes no thread on the loop.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from .. import signals, threads
from ..models import Task, TaskEvent, TaskStatus
from .inputs import pending_inputs

logger = logging.getLogger("mcptasks.lifecycle")


SYSTEM = "system"


class EventKind(StrEnum):
    """What a ``TaskEvent`` row records; the raw statements use these too."""

    CREATED = "created"
    TRANSITION = "transition"
    RUN_STARTED = "run_started"
    REDISPATCHED = "redispatched"
    INPUT = "input"
    EXPIRED = "expired"
    RETRIED = "retried"
    RETRY_OF = "retry_of"
    RESULT_RETRIEVED = "result_retrieved"
    #: The tool raised an exception it retries on: another attempt is due
    #: later (a tool retry; ``retried`` is an operator's retry of a task).
    TOOL_RETRY = "tool_retry"


#: A change that is signalled but not recorded as an event.
STATUS_MESSAGE = "status_message"


def client_actor(owner: str) -> str:
    return f"client:{owner}"


def operator_actor(username: str) -> str:
    return f"operator:{username}"


def worker_actor(name: str) -> str:
    return f"worker:{name}"


#: A publisher of the app's own: called with ``task_changed``'s arguments.
Publisher = Callable[..., None]

#: The app's publishers, each with what says whether a change of this task
#: needs it to run on a thread (it reads the ORM for it).
_publishers: list[tuple[Publisher, Callable[[Task | None], bool]]] = []


def add_publisher(publish: Publisher, *, needs_thread: Callable[[Task | None], bool] = lambda task: False) -> None:
    """Call ``publish`` after each committed change (once per process)."""
    if all(existing is not publish for existing, _ in _publishers):
        _publishers.append((publish, needs_thread))


def _listened() -> bool:
    """Whether anything hears a change: site code, or a publisher."""
    return bool(_publishers) or signals.task_changed.has_listeners(Task)


def _snapshot(task_id: str) -> tuple[Task | None, dict[str, Any] | None]:
    """The task as this change leaves it (read inside the transaction), for
    listeners that must see every transition; skipped when nobody listens."""
    if not _listened():
        return None, None
    task = Task.objects.filter(pk=task_id).first()
    pending = None
    if task is not None and task.status == TaskStatus.INPUT_REQUIRED:
        pending = pending_inputs(task_id)
    return task, pending


def announce(
    task_id: str,
    from_status: str,
    to_status: str,
    actor: str,
    kind: str,
    *,
    task: Task | None = None,
    progress: Mapping[str, Any] | None = None,
) -> None:
    """Log and signal the change once it is committed (never before: a
    listener must not see what a rollback undoes). ``task``, when the caller
    has the row as the change left it, saves the snapshot query. ``progress``:
    a status message's numbers, when its tool gave them."""
    pending: dict[str, Any] | None = {}
    if task is None:
        task, pending = _snapshot(task_id)
    elif task.status == TaskStatus.INPUT_REQUIRED and _listened():
        pending = pending_inputs(task_id)  # the questions this change left open, read in its transaction
    transaction.on_commit(lambda: _send(task_id, from_status, to_status, actor, kind, task, pending, progress))


def announce_committed(
    task: Task,
    from_status: str,
    actor: str,
    kind: str,
    *,
    pending: dict[str, Any] | None = None,
    progress: Mapping[str, Any] | None = None,
) -> None:
    """``announce`` for a change already committed (a statement in
    autocommit), on a thread, with the row as it left it and, where it
    waits, its pending questions."""
    _send(task.id, from_status, task.status, actor, kind, task, pending if pending is not None else {}, progress)


async def aannounce_committed(
    task: Task, from_status: str, actor: str, kind: str, *, pending: dict[str, Any] | None = None
) -> None:
    """``announce_committed`` for a change committed on the event loop: the
    receivers run on a thread, awaited."""
    await on_a_thread(task, lambda: announce_committed(task, from_status, actor, kind, pending=pending))


async def aannounce_created(task: Task, actor: str) -> None:
    """A creation committed on the event loop: ``task_created`` and its
    ``task_changed``, on one thread, awaited (as ``aannounce_committed``)."""

    def send() -> None:
        send_created(task)
        _send(task.id, "", task.status, actor, EventKind.CREATED, task, {})

    await on_a_thread(task, send)


def send_created(task: Task) -> None:
    """``signals.task_created`` for a committed task (on a thread)."""
    send_robustly(signals.task_created, task=task)


async def on_a_thread(task: Task, work: Callable[[], None]) -> None:
    """Run ``work`` (which sends the signals of a change of ``task``) on one
    of the endpoint's threads and wait for it (``threads.on_a_thread``);
    on the loop itself when no site code hears it and no publisher needs a
    thread for it (the log line and the publish alone: no hop)."""
    if _needs_thread(task):
        await threads.on_a_thread(work)
    else:
        work()


def _needs_thread(task: Task) -> bool:
    return (
        signals.task_changed.has_listeners(Task)
        or signals.task_created.has_listeners(Task)
        or any(needs(task) for _, needs in _publishers)
    )


def send_robustly(signal: Signal, **named: Any) -> None:
    """Send ``signal`` to every receiver once; a receiver's error is logged
    and does not stop the others (nor undo, nor repeat, what committed)."""
    task_id = named.get("task_id") or getattr(named.get("task"), "id", None)
    for receiver, outcome in signal.send_robust(sender=Task, **named):
        if isinstance(outcome, Exception):
            _log_failure(receiver, outcome, task_id)


def _log_failure(receiver: Any, exc: BaseException, task_id: str | None) -> None:
    """A receiver's or publisher's error, after a committed change: logged,
    and the others still run."""
    logger.error(
        "receiver %s failed after a committed change",
        _receiver_name(receiver),
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"task_id": task_id},
    )


def _receiver_name(receiver: Any) -> str:
    target = receiver.func if isinstance(receiver, functools.partial) else receiver
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def _send(
    task_id: str,
    from_status: str,
    to_status: str,
    actor: str,
    kind: str,
    task: Task | None,
    pending: Any,
    progress: Mapping[str, Any] | None = None,
) -> None:
    kind = kind.value if isinstance(kind, EventKind) else kind  # listeners get plain strings
    logger.info(
        "task %s %s %s -> %s by %s",
        task_id,
        kind,
        from_status or "-",
        to_status,
        actor,
        extra={"task_id": task_id, "kind": kind, "from_status": from_status, "to_status": to_status, "actor": actor},
    )
    named = {
        "task_id": task_id,
        "from_status": from_status,
        "to_status": to_status,
        "actor": actor,
        "kind": kind,
        "task": task,
        "pending_inputs": pending,
        "progress": progress,
    }
    send_robustly(signals.task_changed, **named)
    for publish, _ in _publishers:
        try:
            publish(sender=Task, **named)
        except Exception as exc:  # as a receiver's: logged, and the change stays committed
            _log_failure(publish, exc, task_id)


def record_event(
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
