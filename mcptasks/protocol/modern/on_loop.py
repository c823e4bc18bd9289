"""The event loop's pipeline for the modern era: ``tools/call`` of a task
tool (creation), ``tasks/get``, ``tasks/update`` and ``tasks/cancel``,
without a Django request, on every database.

Each method is its handler in :mod:`handlers` on ``task_methods.LOOP``:
the same task method, with its steps in their loop forms (on Postgres the
statements of ``queries.sql`` on the loop's own connections; on the ORM
store, each step awaited on a thread).

Which requests the loop serves is decided before anything is done
(:func:`takes`: a task tool's plain creation, a run that can be sent from
the loop); a request it takes, it answers, once. A step that cannot run on
the loop is awaited on a thread at that step: the receivers of a committed
change (``events``), a creation near the owner's quota, the pending
questions of a task waiting for input. Nothing is served again from the top.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ...errors import ProtocolError
from ...tasks import dispatch, sql, store
from ...tools.registry import registry
from .. import limits
from ..caller import Caller
from ..jsonrpc import Message
from ..task_methods import LOOP
from . import handlers, request
from .headers import check_version, has_tasks_extension, validate_headers

__all__ = ["METHODS", "available", "serve", "takes"]


def available() -> bool:
    """Whether requests can be served on the loop at all (checked first, so
    a request that cannot be is not parsed twice)."""
    return limits.poll_throttle_on_loop()


def _sender_ready() -> bool:
    """Whether a run this loop starts can be sent: from the loop itself
    where the store's statements run on it (a sender installed there), or
    from the thread the ORM store's step runs on."""
    return not (store.on_postgres() and sql.loop_available()) or dispatch.loop_sender() is not None


def takes(message: Message, headers: Mapping[str, str]) -> bool:
    """Whether the loop serves this request: decided from the request alone,
    before anything is read, counted or written. The rest (an inline tool,
    an ``auto`` task, a multi-round-trip call, a run that cannot be sent from
    the loop, a request the version checks refuse) takes the thread path
    from the start."""
    if message.method not in METHODS:
        return False
    try:
        _version, capabilities = check_version(message, headers)
    except ProtocolError:
        return False  # the thread path answers it
    if message.method == "tasks/update":
        return _sender_ready()  # a resumed task's run is sent from here
    if message.method != "tools/call":
        return True
    name = message.params.get("name")
    tool = registry.get(name) if isinstance(name, str) else None
    return not (
        tool is None  # the thread path answers the error
        or not has_tasks_extension(capabilities)
        or tool.task not in ("optional", "required")
        or tool.starts_inline
        or "requestState" in message.params
        or "inputResponses" in message.params
        or not _sender_ready()
    )


async def serve(message: Message, caller: Caller, headers: Mapping[str, str]) -> dict[str, Any]:
    """The result of one request that :func:`takes` took; raises
    ``ProtocolError`` as the thread path does (``sql.NotOnLoop`` when the
    task store fails)."""
    method = METHODS[message.method]
    _version, capabilities = check_version(message, headers)
    validate_headers(message, headers)
    return await method(request.Request(message, caller, capabilities, headers))


async def call_tool(req: request.Request) -> dict[str, Any]:
    """A ``tools/call`` that creates a task: committed, then its run
    published, then answered (``CreateTaskResult``). Only what
    :func:`takes` took: a task tool's plain creation."""
    tool, arguments, _kwargs = handlers.checked_tool_call(req)
    return handlers.create_task_result(await handlers.new_task(req, tool, arguments, LOOP, {}))


#: The methods the loop serves, by name.
METHODS: dict[str, Callable[[request.Request], Awaitable[dict[str, Any]]]] = {
    "tools/call": call_tool,
    "tasks/get": lambda req: handlers.get_task(req, LOOP),
    "tasks/update": lambda req: handlers.update_task(req, LOOP),
    "tasks/cancel": lambda req: handlers.cancel_task(req, LOOP),
}
