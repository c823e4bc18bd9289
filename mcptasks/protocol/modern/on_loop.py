"""The event loop's pipeline for the modern era on Postgres: ``tools/call``
of a task tool (creation), ``tasks/get``, ``tasks/update`` and
``tasks/cancel``, without a thread or a Django request.

Each method takes the same steps as its handler in :mod:`handlers`, in the
same order and with the same errors, calling the same named operations in
their loop forms (``lifecycle.acreate_task``, ``reads.apoll``,
``lifecycle.asubmit_input``, ``lifecycle.acancel``: the statements of
``queries.sql``, on the loop's own connections). Whatever is not the common
case raises ``NotOnLoop`` before anything is counted or written, and the
thread path serves it as it always has: an inline tool, an ``auto`` task, a
multi-round-trip call, a ``tasks/get`` of a task waiting for input (its
pending requests are another read), the first read of an outcome by a
caller whose scopes are checked before the read is marked, a run that
cannot be sent from the loop (a broker other than Redis).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ...models import TERMINAL_STATUSES, Task, TaskStatus
from ...tasks import dispatch, lifecycle, poll_snapshot, reads, sql
from ...tasks.sql import NotOnLoop
from ...tools.registry import registry
from .. import authorization, limits
from ..caller import Caller
from ..jsonrpc import Message
from ..shapes import detailed_task
from . import handlers, request
from .headers import check_param_headers, check_version, validate_headers

__all__ = ["METHODS", "NotOnLoop", "available", "read_polled_task", "serve"]


def available() -> bool:
    """Whether requests can be served on the loop at all (checked first, so
    a request that cannot be is not parsed twice)."""
    return sql.loop_available() and limits.poll_throttle_on_loop()


async def serve(message: Message, caller: Caller, headers: Mapping[str, str]) -> dict[str, Any]:
    """The result of one request; raises ``ProtocolError`` as the thread
    path does, or ``NotOnLoop``."""
    method = METHODS.get(message.method)
    if method is None:
        raise NotOnLoop(message.method)
    _version, capabilities = check_version(message, headers)
    validate_headers(message, headers)
    return await method(request.Request(message, caller, capabilities, headers))


async def read_polled_task(req: request.Request) -> Task:
    """The one read of a ``tasks/get`` on the loop, for (owner, task id): the
    caller's task, its first outcome read marked where the read may mark it.
    Raises ``ProtocolError`` (not found, scopes) or ``NotOnLoop``."""
    task_id, owner = request.task_id_param(req), req.caller.owner
    read = _marking_read(lifecycle.client_actor(owner)) if request.marks_in_the_read(req) else reads.alookup
    # From the snapshot where that is sound: a row the poll's own statement
    # marked read may be kept (its outcome_read_at is set), as a later read's.
    return request.owned_task(req, await poll_snapshot.lookup(task_id, owner, read))


def _marking_read(actor: str) -> poll_snapshot.Reader:
    async def read(task_id: str, owner: str) -> Task | None:
        return await reads.apoll(task_id, owner, actor=actor)

    return read


async def get_task(req: request.Request) -> dict[str, Any]:
    task = await read_polled_task(req)
    if task.status == TaskStatus.INPUT_REQUIRED:
        raise NotOnLoop("pending input requests")
    if not request.marks_in_the_read(req) and task.status in TERMINAL_STATUSES and task.outcome_read_at is None:
        raise NotOnLoop("first read of the outcome, after the scope check")
    await limits.athrottle_poll(req.caller.owner, task.id, task.poll_interval_ms)
    return handlers.complete(detailed_task(task))


async def _task_for(req: request.Request) -> Task:
    """``handlers._task_for`` on the loop: the caller's task, or its error."""
    return request.owned_task(req, await reads.alookup(request.task_id_param(req), req.caller.owner))


async def cancel_task(req: request.Request) -> dict[str, Any]:
    task, owner = await _task_for(req), req.caller.owner
    limits.throttle("update", owner)
    await lifecycle.acancel(task.id, actor=lifecycle.client_actor(owner))
    return handlers.complete()


async def update_task(req: request.Request) -> dict[str, Any]:
    if dispatch.loop_sender() is None:  # a resumed task's run must be sent from here
        raise NotOnLoop("a run cannot be sent from the loop")
    task, owner = await _task_for(req), req.caller.owner
    limits.throttle("update", owner)
    await lifecycle.asubmit_input(task.id, request.input_responses(req), actor=lifecycle.client_actor(owner))
    return handlers.complete()


async def call_tool(req: request.Request) -> dict[str, Any]:
    """A ``tools/call`` that creates a task: committed, then its run
    published, then answered (``CreateTaskResult``)."""
    name = req.params.get("name")
    tool = registry.get(name) if isinstance(name, str) else None
    if (
        tool is None  # the thread path answers the error
        or not req.tasks_enabled
        or tool.task not in ("optional", "required")
        or tool.starts_inline
        or "requestState" in req.params
        or "inputResponses" in req.params
        or dispatch.loop_sender() is None
    ):
        raise NotOnLoop("not a task tool's plain creation")
    tool, arguments, _kwargs = handlers.resolve_tool_call(req.params, req.caller.owner)
    authorization.require_tool(req.caller, tool)
    check_param_headers(tool, arguments, req.headers)
    owner = req.caller.owner
    try:
        task = await lifecycle.acreate_task(
            owner=owner,
            tool_name=tool.name,
            arguments=arguments,
            client_capabilities=req.capabilities,
            ttl_ms=tool.ttl_ms,
            poll_interval_ms=tool.poll_interval_ms,
        )
    except NotOnLoop:
        task = None
    if task is None:  # near the owner's quota: its exclusive check, on a thread
        return await _on_a_thread(lambda: handlers.create_task_now(req, tool, arguments, {}))
    return handlers.create_task_result(task)


async def _on_a_thread(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    from asgiref.sync import sync_to_async
    from django.db import close_old_connections

    from ..threads import worker_threads

    def run() -> dict[str, Any]:
        close_old_connections()
        try:
            return work()
        finally:
            close_old_connections()

    return await sync_to_async(run, thread_sensitive=False, executor=worker_threads())()


#: The methods the loop serves, by name.
METHODS: dict[str, Callable[[request.Request], Awaitable[dict[str, Any]]]] = {
    "tools/call": call_tool,
    "tasks/get": get_task,
    "tasks/update": update_task,
    "tasks/cancel": cancel_task,
}
