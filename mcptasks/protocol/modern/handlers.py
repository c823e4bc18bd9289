"""The 2026-07-28 wire with the ``io.modelcontextprotocol/tasks`` extension.

Sessionless: every request carries its protocol version and capabilities in
``params._meta``; nothing is remembered between requests.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...conf import settings
from ...errors import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CAPABILITY,
    PARSE_ERROR,
    TASKS_EXTENSION,
    UNSUPPORTED_VERSION,
    HandOff,
    InputNeeded,
    InvalidParams,
    ProtocolError,
    TaskCancelled,
    missing_tasks_extension,
)
from ...models import Era, Task, TaskStatus
from ...tasks import lifecycle
from ...tools.calls import tool_context
from ...tools.context import ToolContext
from ...tools.invoke import invoke
from ...tools.registry import Tool, registry
from .. import authorization, limits, task_methods
from ..caller import Caller
from ..inline_runs import HungUp, call_cancelled, wait_for_auto_result
from ..jsonrpc import Message
from ..shapes import detailed_task, task_fields
from ..streaming import Deferred, Stream, threaded_call
from ..subscriptions import listen_stream
from ..task_methods import THREAD, Route, now
from .headers import (
    META_LOG_LEVEL,
    META_SERVER_INFO,
    check_param_headers,
    check_version,
    server_info,
    supported_versions,
    validate_headers,
)
from .request import Request
from .request_state import load_request_state, sign_request_state

# Results -------------------------------------------------------------------------


def complete(value: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"resultType": "complete", **(value or {})}
    meta = dict(out.get("_meta") or {})
    meta.setdefault(META_SERVER_INFO, server_info())
    out["_meta"] = meta
    return out


def create_task_result(task: Task) -> dict[str, Any]:
    return {"resultType": "task", **task_fields(task), "_meta": {META_SERVER_INFO: server_info()}}


# Handlers ----------------------------------------------------------------------------

Reply = dict[str, Any] | Stream | Deferred


def server_capabilities() -> dict[str, Any]:
    return {
        "tools": {"listChanged": True},
        "resources": {},
        "prompts": {"listChanged": True},
        "completions": {},
        "logging": {},
        "extensions": {TASKS_EXTENSION: {}},
    }


def cacheable(value: dict[str, Any], scope: str = "public") -> dict[str, Any]:
    return complete({**value, "ttlMs": settings.LIST_TTL_MS, "cacheScope": scope})


def discover(req: Request) -> Reply:
    result: dict[str, Any] = {"supportedVersions": supported_versions(), "capabilities": server_capabilities()}
    if settings.INSTRUCTIONS:
        result["instructions"] = settings.INSTRUCTIONS
    return cacheable(result)


def _no_cursor(req: Request) -> None:
    if req.params.get("cursor") is not None:
        raise InvalidParams("Invalid cursor: every item is on the first page")


def list_tools(req: Request) -> Reply:
    _no_cursor(req)
    return cacheable({"tools": [t.describe() for t in registry.all()]})


def _object_param(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = params.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParams(f'"{name}" must be an object')
    return value


def resolve_tool_call(params: Mapping[str, Any], owner: str) -> tuple[Tool, dict[str, Any], dict[str, Any]]:
    """The tool a tools/call names, its arguments and their validated form
    (both eras): unknown tools and bad arguments are -32602, and the call
    counts against the caller's rate."""
    name = params.get("name")
    if not isinstance(name, str):
        raise InvalidParams('tools/call needs "name" (a string)')
    tool = registry.get(name)
    if tool is None:
        raise InvalidParams(f"Unknown tool: {name}")
    limits.throttle("call", owner)
    arguments = _object_param(params, "arguments")
    limits.check_size(arguments, settings.MAX_ARGUMENTS_BYTES, "arguments")
    return tool, arguments, tool.validate_arguments(arguments)


def _mrtr_answers(req: Request, subject: str, arguments: Any) -> dict[str, Any]:
    """Answers for this MRTR round: earlier rounds' from the signed
    ``requestState``, this round's from ``inputResponses``."""
    answers: dict[str, Any] = {}
    if "requestState" in req.params:
        answers = load_request_state(req.params["requestState"], req.caller.owner, subject, arguments)
    if "inputResponses" in req.params:
        responses = req.params["inputResponses"]
        if not isinstance(responses, dict):
            raise InvalidParams('"inputResponses" must be an object')
        limits.check_size(responses, settings.MAX_INPUT_RESPONSES_BYTES, "inputResponses")
        answers.update(responses)
    return answers


def _input_required(
    need: InputNeeded, req: Request, subject: str, arguments: Any, answers: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "resultType": "input_required",
        "inputRequests": need.requests,
        "requestState": sign_request_state(req.caller.owner, subject, arguments, answers),
    }


def _inline(
    req: Request,
    answers: Mapping[str, Any],
    run: Callable[[ToolContext], dict[str, Any]],
    *,
    can_hand_off: bool = False,
) -> Reply:
    """Run ``run(ctx)`` within the request, off the web threads, streaming its
    notifications when the request asked for them; a hang-up cancels it."""

    def make_context(
        notify: Callable[[str, dict[str, Any]], None] | None = None, cancel: threading.Event | None = None
    ) -> ToolContext:
        return tool_context(
            owner=req.caller.owner,
            user=req.caller.user,
            capabilities=req.capabilities,
            answers=answers,
            can_hand_off=can_hand_off,
            notify=notify,
            cancel_event=cancel,
            progress_token=req.meta.get("progressToken"),
            log_level=req.meta.get(META_LOG_LEVEL),
        )

    if not req.wants_notifications:
        return Deferred(lambda cancel: run(make_context(cancel=cancel)), req.caller.owner)
    return threaded_call(req.message.id, lambda notify, cancel: run(make_context(notify, cancel)), req.caller.owner)


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
    answers = _mrtr_answers(req, subject, arguments)
    if wants_task and not tool.starts_inline:
        if tool.task == "auto":  # waits a little for the result: not on a web thread
            return Deferred(lambda cancel: create_task_now(req, tool, arguments, {}, cancel.is_set), req.caller.owner)
        return create_task_now(req, tool, arguments, {})

    def run(ctx: ToolContext) -> dict[str, Any]:
        try:
            return complete(invoke(tool, ctx, kwargs))
        except InputNeeded as need:
            return _input_required(need, req, subject, arguments, answers)
        except HandOff:
            answered = {
                key: lifecycle.Answer(method=q.method, params=q.params, response=answers[key])
                for key, q in ctx.asked.items()
                if key in answers
            }
            return create_task_now(req, tool, arguments, answered, lambda: ctx.cancelled)
        except TaskCancelled:
            raise call_cancelled() from None

    return _inline(req, answers, run, can_hand_off=wants_task)


def create_task_now(
    req: Request, tool: Tool, arguments: dict[str, Any], answered: Mapping[str, lifecycle.Answer], gone: HungUp = None
) -> dict[str, Any]:
    task = now(new_task(req, tool, arguments, THREAD, answered))
    # create_task committed: a tasks/get for this id resolves from here on.
    if tool.task == "auto":
        done = wait_for_auto_result(task.id, req.caller.owner, gone)
        if done is not None and done.status == TaskStatus.COMPLETED:
            return complete(done.result or {})
        if done is not None and done.status == TaskStatus.FAILED and done.error:
            raise ProtocolError(
                done.error.get("code", INTERNAL_ERROR), done.error.get("message", "Failed"), done.error.get("data")
            )
    return create_task_result(task)


async def new_task(
    req: Request, tool: Tool, arguments: dict[str, Any], route: Route, answered: Mapping[str, lifecycle.Answer]
) -> Task:
    return await task_methods.create(
        route, req.caller.owner, tool, arguments, era=Era.MODERN, capabilities=req.capabilities, answered=answered
    )


# Prompts, resources, completion ---------------------------------------------------------


def list_prompts(req: Request) -> dict[str, Any]:
    _no_cursor(req)
    return cacheable({"prompts": [p.describe() for p in registry.prompts.values()]})


def _prompt_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": {"type": "text", "text": value}}]
    return list(value)


def get_prompt(req: Request) -> Reply:
    name = req.params.get("name")
    prompt = registry.prompts.get(name) if isinstance(name, str) else None
    if prompt is None:
        raise InvalidParams(f"Unknown prompt: {name}")
    arguments = _object_param(req.params, "arguments")
    missing = [a["name"] for a in prompt.arguments if a["required"] and a["name"] not in arguments]
    unknown = set(arguments) - {a["name"] for a in prompt.arguments}
    if missing or unknown:
        raise InvalidParams(
            f"Invalid arguments for prompt '{prompt.name}': missing {missing}, unknown {sorted(unknown)}"
        )
    if any(not isinstance(v, str) for v in arguments.values()):
        raise InvalidParams("Prompt arguments must be strings")
    subject = f"prompt:{prompt.name}"
    answers = _mrtr_answers(req, subject, arguments)

    def run(ctx: ToolContext) -> dict[str, Any]:
        try:
            value = prompt.fn(ctx, **arguments) if prompt.wants_context else prompt.fn(**arguments)
        except InputNeeded as need:
            return _input_required(need, req, subject, arguments, answers)
        result: dict[str, Any] = {"messages": _prompt_messages(value)}
        if prompt.description:
            result["description"] = prompt.description
        return complete(result)

    return _inline(req, answers, run)


def list_resources(req: Request) -> dict[str, Any]:
    _no_cursor(req)
    return cacheable({"resources": [r.describe() for r in registry.resources.values()]})


def list_resource_templates(req: Request) -> dict[str, Any]:
    _no_cursor(req)
    return cacheable({"resourceTemplates": [t.describe() for t in registry.templates]})


def _contents(uri: str, mime_type: str | None, value: Any) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    contents = []
    for item in items:
        if isinstance(item, dict):
            contents.append({"uri": uri, **({"mimeType": mime_type} if mime_type else {}), **item})
            continue
        entry: dict[str, Any] = {"uri": uri}
        if mime_type:
            entry["mimeType"] = mime_type
        if isinstance(item, bytes):
            entry["blob"] = base64.b64encode(item).decode("ascii")
        else:
            entry["text"] = str(item)
        contents.append(entry)
    return contents


def read_resource(req: Request) -> dict[str, Any]:
    uri = req.params.get("uri")
    if not isinstance(uri, str):
        raise InvalidParams('resources/read needs "uri" (a string)')
    found = registry.find_resource(uri)
    if found is None:
        raise InvalidParams("Resource not found", {"uri": uri})
    fn, params, mime_type = found
    return cacheable({"contents": _contents(uri, mime_type, fn(**params))})


def complete_argument(req: Request) -> dict[str, Any]:
    ref = _object_param(req.params, "ref")
    argument = _object_param(req.params, "argument")
    if not isinstance(argument.get("name"), str) or not isinstance(argument.get("value", ""), str):
        raise InvalidParams('completion/complete needs "argument" with a string name and value')
    values: list[str] = []
    if ref.get("type") == "ref/prompt":
        prompt = registry.prompts.get(ref.get("name", ""))
        if prompt is None:
            raise InvalidParams(f"Unknown prompt: {ref.get('name')}")
        completer = prompt.completions.get(argument["name"])
        if completer is not None:
            values = [v for v in completer(argument.get("value", "")) if isinstance(v, str)]
    elif ref.get("type") != "ref/resource":
        raise InvalidParams('"ref.type" must be "ref/prompt" or "ref/resource"')
    return complete({"completion": {"values": values[:100], "total": len(values), "hasMore": len(values) > 100}})


# Subscriptions ----------------------------------------------------------------------------


def listen(req: Request) -> Reply:
    """``subscriptions/listen``: acknowledge the filter, then stream changes.

    Task ids the caller does not own (or that do not exist) are silently
    left out of the acknowledgement: indistinguishable, like tasks/get.
    """
    limits.throttle("listen", req.caller.owner)
    wanted = req.params.get("notifications")
    if not isinstance(wanted, dict):
        raise InvalidParams('subscriptions/listen needs "notifications" (an object)')
    acknowledged: dict[str, Any] = {}
    task_ids: list[str] = []
    if "taskIds" in wanted:
        requested = wanted["taskIds"]
        if not isinstance(requested, list) or not all(isinstance(t, str) for t in requested):
            raise InvalidParams('"notifications.taskIds" must be an array of strings')
        if not req.tasks_enabled:
            raise missing_tasks_extension()
        if len(requested) > settings.MAX_LISTEN_TASKS:
            raise InvalidParams(f"At most {settings.MAX_LISTEN_TASKS} task ids per subscription")
        requested = list(dict.fromkeys(requested))
        owned_tasks = list(Task.objects.filter(pk__in=requested, owner=req.caller.owner).only("id", "tool_name"))
        for task in owned_tasks:
            authorization.require_task(req.caller, task)
        owned = {task.id for task in owned_tasks}
        task_ids = [tid for tid in requested if tid in owned]
        acknowledged["taskIds"] = task_ids
    for flag in ("toolsListChanged", "promptsListChanged"):
        if wanted.get(flag) is True:
            acknowledged[flag] = True
    assert req.message.id is not None  # a request: notifications never reach a handler
    return Stream(listen_stream(req.message.id, acknowledged, task_ids))


# Tasks ---------------------------------------------------------------------------------


def _task_params(req: Request) -> dict[str, Any]:
    """A task method's params, once the tasks extension is declared (-32021 before anything else)."""
    if not req.tasks_enabled:
        raise missing_tasks_extension()
    return req.params


async def get_task(req: Request, route: Route = THREAD) -> dict[str, Any]:
    return await task_methods.get(route, req.caller, _task_params(req), lambda task: complete(detailed_task(task)))


async def update_task(req: Request, route: Route = THREAD) -> dict[str, Any]:
    await task_methods.update(route, req.caller, _task_params(req))
    return complete()


async def cancel_task(req: Request, route: Route = THREAD) -> dict[str, Any]:
    await task_methods.cancel(route, req.caller, _task_params(req))
    return complete()


HANDLERS: dict[str, Callable[[Request], Reply]] = {
    "server/discover": discover,
    "tools/list": list_tools,
    "tools/call": call_tool,
    "prompts/list": list_prompts,
    "prompts/get": get_prompt,
    "resources/list": list_resources,
    "resources/read": read_resource,
    "resources/templates/list": list_resource_templates,
    "completion/complete": complete_argument,
    "subscriptions/listen": listen,
    "tasks/get": lambda req: now(get_task(req)),
    "tasks/update": lambda req: now(update_task(req)),
    "tasks/cancel": lambda req: now(cancel_task(req)),
}


def handle(message: Message, caller: Caller, headers: Mapping[str, str]) -> Reply:
    """Validate and run one modern request; raises ``ProtocolError``.

    Order matters: required ``_meta`` (-32602), header/body agreement (-32020),
    the version (-32022), the method (-32601); capabilities are each
    handler's to check (-32021), before it looks anything up.
    """
    _version, capabilities = check_version(message, headers)
    validate_headers(message, headers)
    handler = HANDLERS.get(message.method)
    if handler is None:
        raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {message.method}")
    return handler(Request(message, caller, capabilities, headers))


def http_status(exc: ProtocolError) -> int:
    """HTTP status for a JSON-RPC error on the modern wire."""
    if exc.http_status is not None:
        return exc.http_status
    if exc.code == METHOD_NOT_FOUND:
        return 404
    if exc.code in (PARSE_ERROR, INVALID_REQUEST, HEADER_MISMATCH, MISSING_CAPABILITY, UNSUPPORTED_VERSION):
        return 400
    if exc.code == INTERNAL_ERROR:
        return 500
    return 200
