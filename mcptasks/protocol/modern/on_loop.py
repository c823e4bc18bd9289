"""``tasks/get`` on the event loop: the common poll without a thread.

The same steps as :func:`handlers.handle` with :func:`handlers.get_task`, in
the same order and with the same errors; only the task read
(``reads.apoll``, which also marks the first read of a finished task's
outcome, in the same statement) and the poll throttle
(:func:`limits.athrottle_poll`) are awaited instead of blocking. Whatever is
not the common case raises ``NotOnLoop`` before anything is counted, and
the thread path serves it as it always has: a task waiting for input (its
pending requests are another read), and the first read of an outcome by a
caller whose scopes are checked before the read is marked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...models import TERMINAL_STATUSES, TaskStatus
from ...tasks import lifecycle, reads, sql
from ...tasks.sql import NotOnLoop
from .. import limits
from ..caller import Caller
from ..jsonrpc import Message
from . import handlers
from .headers import check_version, validate_headers

__all__ = ["NotOnLoop", "available", "get_task"]


def available() -> bool:
    """Whether polls can be served on the loop at all (checked first, so a
    request that cannot be is not parsed twice)."""
    return sql.loop_available() and limits.poll_throttle_on_loop()


async def get_task(message: Message, caller: Caller, headers: Mapping[str, str]) -> dict[str, Any]:
    """The result of a ``tasks/get``; raises ``ProtocolError`` as the thread
    path does, or ``NotOnLoop``."""
    if message.method != "tasks/get":
        raise NotOnLoop(message.method)
    _version, capabilities = check_version(message, headers)
    validate_headers(message, headers)
    req = handlers.Request(message, caller, capabilities, headers)
    task = await read_polled_task(req)
    if task.status == TaskStatus.INPUT_REQUIRED:
        raise NotOnLoop("pending input requests")
    if not handlers.marks_in_the_read(req) and task.status in TERMINAL_STATUSES and task.outcome_read_at is None:
        raise NotOnLoop("first read of the outcome, after the scope check")
    await limits.athrottle_poll(caller.owner, task.id, task.poll_interval_ms)
    return handlers.complete(handlers.detailed_task(task))


async def read_polled_task(req: handlers.Request) -> Any:
    """The one read of a ``tasks/get`` on the loop, for (owner, task id): the
    caller's task, its first outcome read marked where the read may mark it.
    Raises ``ProtocolError`` (not found, scopes) or ``NotOnLoop``."""
    task_id, owner = handlers.task_id_param(req), req.caller.owner
    if handlers.marks_in_the_read(req):
        found = await reads.apoll(task_id, owner, actor=lifecycle.client_actor(owner))
    else:
        found = await reads.alookup(task_id, owner)
    return handlers.owned_task(req, found)
