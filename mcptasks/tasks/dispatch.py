"""The seam through which a task's run leaves the domain for a worker.

The domain asks for a run with ``enqueue_run(task_id)`` after commit; it
never imports the worker. The runtime that can send runs (Celery, in
``mcptasks.worker.dispatch``) installs itself here when the app is ready,
the same way notification publishing connects to ``mcptasks.signals``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from django.db import transaction

logger = logging.getLogger("mcptasks.runtime")

#: Sends one run of the task; returns whether the message was published.
Sender = Callable[[str], bool]

#: The same on the event loop.
LoopSender = Callable[[str], Awaitable[bool]]

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
    """How to send a run from the event loop, or ``None`` (runs are sent
    from threads only: creation then takes the thread path)."""
    return _loop_sender() if _loop_sender is not None else None


def enqueue_run(task_id: str) -> bool:
    """Send a run of ``task_id`` to a worker. ``False`` when it could not be
    sent: the row is durable, and the sweeper re-enqueues it later."""
    if task_id in _runs_here:
        return True
    if _sender is None:
        logger.warning("no runtime installed to run task %s; the sweeper will retry", task_id)
        return False
    return _sender(task_id)


def enqueue_after_commit(task_id: str) -> None:
    transaction.on_commit(lambda: enqueue_run(task_id))


@contextmanager
def runs_here(task_id: str) -> Iterator[None]:
    """Within the block, a run of ``task_id`` is not sent to a worker: the
    caller makes it in this process (``mcptasks.testing``)."""
    _runs_here.add(task_id)
    try:
        yield
    finally:
        _runs_here.discard(task_id)
