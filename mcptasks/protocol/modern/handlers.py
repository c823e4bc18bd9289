"""The 2026-07-28 wire with the ``io.modelcontextprotocol/tasks`` extension, sessionless (each request
carries its version and capabilities in ``params._meta``): served on a thread (:func:`handle`) or, for a
task tool's plain creation and the task methods, on the event loop (:func:`serve_on_loop`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ... import errors
from ...conf import settings
from ...errors import HandOff, InvalidParams, ProtocolError, TaskCancelled, missing_tasks_extension
from ...models import Era, Task, TaskStatus
from ...tasks import dispatch, lifecycle, sql, store
from ...tools.context import ToolContext
from ...tools.invoke import invoke
from ...tools.registry import Tool, registry
from .. import authorization, limits, task_methods
from ..caller import Caller
from ..inline_runs import HungUp, call_cancelled, wait_for_auto_result
from ..jsonrpc import Message
from ..shapes import detailed_task, task_fields
from ..streaming import Deferred, Stream
from ..subscriptions import listen
from ..task_methods import LOOP, THREAD, Route, now
from . import catalog
from .headers import (
    META_SERVER_INFO,
    TASK_METHODS,
    check_param_headers,
    check_version,
    has_tasks_extension,
    server_info,
    validate_headers,
)
from .request import Request
from .request_state import inline_call, round_answers

Reply = dict[str, Any] | Stream | Deferred
Answered = Mapping[str, lifecycle.Answer] | None


def complete(value: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"resultType": "complete", **(value or {})}
    out["_meta"] = {META_SERVER_INFO: server_info(), **(out.get("_meta") or {})}
    return out


def create_task_result(task: Task) -> dict[str, Any]:
    return {"resultType": "task", **task_fields(task), "_meta": {META_SERVER_INFO: server_info()}}


def _listed(read: Callable[[Mapping[str, Any]], dict[str, Any]]) -> Callable[[Request], Reply]:
    """A catalogue method, answered with its caching hints."""
    return lambda req: complete({**read(req.params), "ttlMs": settings.LIST_TTL_MS, "cacheScope": "public"})


def resolve_tool_call(params: Mapping[str, Any], owner: str) -> tuple[Tool, dict[str, Any], dict[str, Any]]:
    """The tool a tools/call names, its arguments and their validated form (both eras;
    -32602 for an unknown tool or bad arguments), the call counted against the caller's rate."""
    name = params.get("name")
    if not isinstance(name, str):
        raise InvalidParams('tools/call needs "name" (a string)')
    tool = registry.get(name)
    if tool is None:
        raise InvalidParams(f"Unknown tool: {name}")
    limits.throttle("call", owner)
    arguments = catalog.object_param(params, "arguments")
    limits.check_size(arguments, settings.MAX_ARGUMENTS_BYTES, "arguments")
    return tool, arguments, tool.validate_arguments(arguments)


def checked_tool_call(req: Request) -> tuple[Tool, dict[str, Any], dict[str, Any]]:
    """``resolve_tool_call``, then the caller's scopes and the parameter headers."""
    tool, arguments, kwargs = resolve_tool_call(req.params, req.caller.owner)
    authorization.require_tool(req.caller, tool)
    check_param_headers(tool, arguments, req.headers)
    return tool, arguments, kwargs


def call_tool(req: Request) -> Reply:
    tool, arguments, kwargs = checked_tool_call(req)
    if tool.task == "required" and not req.tasks_enabled:
        raise missing_tasks_extension()
    wants_task = req.tasks_enabled and tool.task in ("optional", "required", "auto")
    subject = f"tool:{tool.name}"
    answers = round_answers(req.params, req.caller.owner, subject, arguments)
    if wants_task and not tool.starts_inline:
        if tool.task == "auto":  # waits a little for the result: not on a web thread
            return Deferred(lambda cancel: now(start_task(req, tool, arguments, gone=cancel.is_set)), req.caller.owner)
        return now(start_task(req, tool, arguments))

    def run(ctx: ToolContext) -> dict[str, Any]:
        try:
            return complete(invoke(tool, ctx, kwargs))
        except HandOff:
            answered = {
                key: lifecycle.Answer(method=q.method, params=q.params, response=answers[key])
                for key, q in ctx.asked.items()
                if key in answers
            }
            return now(start_task(req, tool, arguments, answered=answered, gone=lambda: ctx.cancelled))
        except TaskCancelled:
            raise call_cancelled() from None

    return inline_call(req, subject, arguments, answers, run, can_hand_off=wants_task)


async def start_task(
    req: Request, tool: Tool, arguments: dict[str, Any], *, answered: Answered = None, gone: HungUp = None
) -> dict[str, Any]:
    """A tools/call's task, created: its ``CreateTaskResult``, or an ``auto``
    tool's outcome if it comes soon (a wait the loop never takes)."""
    task = await task_methods.create(
        req.route, req.caller.owner, tool, arguments, era=Era.MODERN, capabilities=req.capabilities, answered=answered
    )
    # create committed: a tasks/get for this id resolves from here on.
    if tool.task == "auto":
        done = wait_for_auto_result(task.id, req.caller.owner, gone)
        if done is not None and done.status == TaskStatus.COMPLETED:
            return complete(done.result or {})
        if done is not None and done.status == TaskStatus.FAILED and done.error:
            code, message = done.error.get("code", errors.INTERNAL_ERROR), done.error.get("message", "Failed")
            raise ProtocolError(code, message, done.error.get("data"))
    return create_task_result(task)


def get_prompt(req: Request) -> Reply:
    prompt, arguments = catalog.prompt_call(req.params)
    subject = f"prompt:{prompt.name}"
    answers = round_answers(req.params, req.caller.owner, subject, arguments)
    return inline_call(
        req, subject, arguments, answers, lambda ctx: complete(catalog.prompt_result(prompt, ctx, arguments))
    )


async def task_method(req: Request) -> dict[str, Any]:
    """``tasks/get``, ``tasks/update`` or ``tasks/cancel``, once the tasks
    extension is declared (-32021 before anything else)."""
    if not req.tasks_enabled:
        raise missing_tasks_extension()
    if req.message.method == "tasks/get":
        return await task_methods.get(req.route, req.caller, req.params, lambda task: complete(detailed_task(task)))
    if req.message.method == "tasks/update":
        await task_methods.update(req.route, req.caller, req.params)
    else:
        await task_methods.cancel(req.route, req.caller, req.params)
    return complete()


HANDLERS: dict[str, Callable[[Request], Reply]] = {
    "server/discover": _listed(catalog.discover),
    "tools/list": _listed(catalog.list_tools),
    "tools/call": call_tool,
    "prompts/list": _listed(catalog.list_prompts),
    "prompts/get": get_prompt,
    "resources/list": _listed(catalog.list_resources),
    "resources/read": _listed(catalog.read_resource),
    "resources/templates/list": _listed(catalog.list_resource_templates),
    "completion/complete": lambda req: complete(catalog.complete_argument(req.params)),
    "subscriptions/listen": lambda req: listen(req.params, req.caller, req.tasks_enabled, req.message.id),
    **dict.fromkeys(TASK_METHODS, lambda req: now(task_method(req))),
}


def _request(message: Message, caller: Caller, headers: Mapping[str, str], route: Route = THREAD) -> Request:
    """Every request's checks: ``_meta`` (-32602), header/body agreement (-32020), the
    version (-32022); capabilities are each handler's to check (-32021), before any lookup."""
    _version, capabilities = check_version(message, headers)
    validate_headers(message, headers)
    return Request(message, caller, capabilities, headers, route)


def handle(message: Message, caller: Caller, headers: Mapping[str, str]) -> Reply:
    """Validate and run one modern request on its thread; raises ``ProtocolError``."""
    req = _request(message, caller, headers)
    handler = HANDLERS.get(message.method)
    if handler is None:
        raise ProtocolError(errors.METHOD_NOT_FOUND, f"Method not found: {message.method}")
    return handler(req)


#: The modern wire's HTTP status for an error code that names none (200 for the others).
_HTTP_STATUS = {
    errors.PARSE_ERROR: 400,
    errors.INVALID_REQUEST: 400,
    errors.HEADER_MISMATCH: 400,
    errors.MISSING_CAPABILITY: 400,
    errors.UNSUPPORTED_VERSION: 400,
    errors.METHOD_NOT_FOUND: 404,
    errors.INTERNAL_ERROR: 500,
}


def http_status(exc: ProtocolError) -> int:
    """HTTP status for a JSON-RPC error on the modern wire."""
    return exc.http_status if exc.http_status is not None else _HTTP_STATUS.get(exc.code, 200)


#: The methods the loop may serve (the same handlers, on ``LOOP``).
LOOP_METHODS = ("tools/call", *TASK_METHODS)


def takes_on_loop(message: Message, headers: Mapping[str, str]) -> bool:
    """Whether the loop serves this request (a task method, a task tool's plain creation),
    decided from it alone before anything is read, counted or written."""
    if message.method not in LOOP_METHODS:
        return False
    try:
        _version, capabilities = check_version(message, headers)
    except ProtocolError:
        return False  # the thread path answers it
    if message.method == "tools/call":
        name = message.params.get("name")
        tool = registry.get(name) if isinstance(name, str) else None
        if tool is None or tool.task not in ("optional", "required") or tool.starts_inline:
            return False  # the thread path answers an unknown tool, and runs a tool inline
        if not has_tasks_extension(capabilities) or {"requestState", "inputResponses"} & message.params.keys():
            return False
    elif message.method != "tasks/update":
        return True
    # A created or resumed task's run is sent from here: from the loop where
    # the store's statements run on it, else from the ORM step's thread.
    return not (store.on_postgres() and sql.loop_available()) or dispatch.loop_sender() is not None


async def serve_on_loop(message: Message, caller: Caller, headers: Mapping[str, str]) -> dict[str, Any]:
    """The result of a request :func:`takes_on_loop` took; raises as
    :func:`handle` does (``sql.NotOnLoop`` when the task store fails)."""
    req = _request(message, caller, headers, LOOP)
    if message.method == "tools/call":
        tool, arguments, _kwargs = checked_tool_call(req)
        return await start_task(req, tool, arguments)
    return await task_method(req)
