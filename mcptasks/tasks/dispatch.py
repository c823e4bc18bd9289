"""The seam through which a task's run leaves the domain (``enqueue_run``, after commit) for a worker:
the runtime that sends runs (Celery, ``mcptasks.worker.dispatch``) installs itself here when the app is ready."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import transaction

from ..models import Task
from ..tools.controls import HARD_KILL_MARGIN_SECONDS
from ..tools.effective import controls_for, queue_for

logger = logging.getLogger("mcptasks.runtime")


@dataclass(frozen=True)
class Route:
    """Where and how one run's message goes."""

    #: The Celery queue (``None``: Celery's default queue).
    queue: str | None = None
    #: Celery's hard time limit: it kills a prefork process whose run outlived its tool's ``time_limit``.
    kill_after: float | None = None
    #: Seconds before the run is due (a retry's backoff).
    countdown: float | None = None


def route(tool_name: str, *, countdown: float | None = None) -> Route:
    controls = controls_for(tool_name)
    kill_after = controls.time_limit + HARD_KILL_MARGIN_SECONDS if controls.time_limit else None
    return Route(queue_for(tool_name), kill_after, countdown)


#: Sends one run of the task; ``False`` if not sent: the sweeper re-enqueues it later.
Sender = Callable[[str, Route], bool]
LoopSender = Callable[[str, Route], Awaitable[bool]]

_sender: Sender | None = None
#: Gives the loop's sender for the current configuration, or ``None``.
_loop_sender: Callable[[], LoopSender | None] | None = None
#: Tasks whose runs this process makes itself (``mcptasks.testing``): not sent.
_runs_here: set[str] = set()


def install(sender: Sender, loop_sender: Callable[[], LoopSender | None] | None = None) -> None:
    global _sender, _loop_sender
    _sender = sender
    _loop_sender = loop_sender


def loop_sender() -> LoopSender | None:
    """How to send a run from the event loop, or ``None`` (creation then takes the thread path)."""
    return _loop_sender() if _loop_sender is not None else None


def enqueue_run(task_id: str, tool_name: str | None = None, *, countdown: float | None = None) -> bool:
    """Send a run of ``task_id`` to its tool's queue (the tool read from its row if not given)."""
    if task_id in _runs_here:
        return True
    if _sender is None:
        logger.warning("no runtime installed to run task %s; the sweeper will retry", task_id)
        return False
    if tool_name is None:
        tool_name = Task.objects.filter(pk=task_id).values_list("tool_name", flat=True).first()
        if tool_name is None:  # deleted meanwhile: nothing to run
            return False
    return _sender(task_id, route(tool_name, countdown=countdown))


def send_on_thread(task_id: str, route: Route) -> bool:
    """The installed thread sender itself (the loop's sender's fallback)."""
    return _sender is not None and _sender(task_id, route)


def enqueue_after_commit(task_id: str, tool_name: str | None = None, *, countdown: float | None = None) -> None:
    transaction.on_commit(lambda: enqueue_run(task_id, tool_name, countdown=countdown))


@contextmanager
def runs_here(task_id: str) -> Iterator[None]:
    """Within the block, a run of ``task_id`` is not sent: the caller makes it in this process."""
    _runs_here.add(task_id)
    try:
        yield
    finally:
        _runs_here.discard(task_id)
