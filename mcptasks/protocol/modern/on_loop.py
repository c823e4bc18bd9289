"""``tasks/get`` on the event loop: the common poll without a thread.

The same steps as :func:`handlers.handle` with :func:`handlers.get_task`, in
the same order and with the same errors; only the task read
(``mcptasks.tasks.loop_reads``) and the poll throttle
(:func:`limits.athrottle_poll`) are awaited instead of blocking. Whatever is
not the common case raises ``NotOnLoop`` before anything is counted or
written, and the thread path serves it as it always has: a task waiting for
input (its pending requests are another read), and the first read of a
finished task's outcome (its audit event is a write).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...models import TERMINAL_STATUSES, TaskStatus
from ...tasks import loop_reads, poll_snapshot
from ...tasks.loop_reads import NotOnLoop
from .. import limits
from ..caller import Caller
from ..jsonrpc import Message
from . import handlers
from .headers import check_version, validate_headers

__all__ = ["NotOnLoop", "available", "get_task"]


def available() -> bool:
    """Whether polls can be served on the loop at all (checked first, so a
    request that cannot be is not parsed twice)."""
    return loop_reads.available() and limits.poll_throttle_on_loop()


async def get_task(message: Message, caller: Caller, headers: Mapping[str, str]) -> dict[str, Any]:
    """The result of a ``tasks/get``; raises ``ProtocolError`` as the thread
    path does, or ``NotOnLoop``."""
    if message.method != "tasks/get":
        raise NotOnLoop(message.method)
    _version, capabilities = check_version(message, headers)
    validate_headers(message, headers)
    req = handlers.Request(message, caller, capabilities, headers)
    task_id = handlers.task_id_param(req)
    task = handlers.owned_task(req, await poll_snapshot.lookup(task_id, caller.owner, loop_reads.lookup))
    if task.status == TaskStatus.INPUT_REQUIRED:
        raise NotOnLoop("pending input requests")
    if task.status in TERMINAL_STATUSES and task.outcome_read_at is None:
        raise NotOnLoop("first read of the outcome")
    await limits.athrottle_poll(caller.owner, task.id, task.poll_interval_ms)
    return handlers.polled_task(req, task)  # audit logging only: the outcome was read before
