"""The 2025-era session wire: ``initialize``, ``Mcp-Session-Id`` and the
experimental tasks of 2025-11-25, on the same durable engine as the
2026-07-28 wire.

An ``initialize`` opens a session (a ``LegacySession`` row); every later
request of the session names it in ``Mcp-Session-Id`` and is served with the
rules of the negotiated version: results without ``resultType``, the
server's requests to the client on SSE streams, the 2025-11-25 task methods
(``tasks/get``, ``tasks/result``, ``tasks/list``, ``tasks/cancel``) on the
same ``Task`` rows, created through ``lifecycle`` with ``era=LEGACY``.

The older versions without tasks (2025-06-18, 2025-03-26) are negotiated
too; their sessions see no task capability, no ``execution`` on tools, and
no tool that can only run as a task.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.db import transaction

from ...conf import settings
from ...errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    InputNeeded,
    InvalidParams,
    ProtocolError,
)
from ...models import Era, InputRequest, InputRequestState, LegacySession
from ...tasks import lifecycle
from ...tools.calls import tool_context
from ...tools.context import LOG_LEVELS, validate_input_response
from ...tools.invoke import invoke
from ...tools.registry import Tool, registry
from .. import authorization, jsonrpc, limits, request_limits, task_methods
from ..caller import Caller
from ..modern import catalog
from ..modern import handlers as modern
from ..modern.headers import server_info
from ..replies import WireReply, empty_reply, error_reply, message_reply, result_reply, stream_reply
from ..streaming import Deferred, Stream
from ..task_methods import THREAD, now
from . import sessions as legacy_sessions
from . import streams as legacy_streams
from .calls import TASKS_VERSION, Call, Reply, legacy_result
from .sessions import related, task_object
from .tasks import cancel_task, get_task, list_tasks, task_result

#: Newest first: what ``initialize`` negotiates.
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST_VERSION = LEGACY_VERSIONS[0]

SESSION_HEADER = "Mcp-Session-Id"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"

_TASK_SUPPORT = {"never": "forbidden", "optional": "optional", "auto": "optional", "required": "required"}
_TOKEN = re.compile(r"[0-9a-f]{32}")


# Replies ------------------------------------------------------------------------------------------


def _http_error(status: int, message: str, code: int = INVALID_REQUEST, request_id: Any = None) -> WireReply:
    return message_reply(jsonrpc.error(request_id, ProtocolError(code, message)), status=status)


def _no_session(request_id: Any = None) -> WireReply:
    return _http_error(
        404, "Session not found: it ended, expired or never existed; initialize a new one", request_id=request_id
    )


def handle_post(session_id: str | None, data: Any, caller: Caller) -> WireReply:
    """One POSTed message of the 2025-era wire: a request, a notification, or
    the client's response to a request of ours. ``session_id``: the request's
    ``Mcp-Session-Id`` header."""
    if isinstance(data, list):
        return _http_error(400, "Invalid Request: batches are not supported")
    if not isinstance(data, dict):
        return _http_error(400, "Invalid Request: expected a JSON object")
    if "method" not in data and ("result" in data or "error" in data):
        return _post_response(session_id, data, caller)
    try:
        message = jsonrpc.parse_message(data)
    except ProtocolError as exc:
        raw_id = data.get("id")
        request_id = raw_id if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) else None
        return message_reply(jsonrpc.error(request_id, exc), status=400)
    if message.method == "initialize" and not message.is_notification:
        return _answered(message.id, lambda: _initialize(message, caller))
    if not session_id:
        if message.method == "ping" and not message.is_notification:
            return result_reply(message.id, {})  # ping is fine at any time
        return _http_error(
            400, f"Bad Request: the {SESSION_HEADER} header is required (send initialize first)", request_id=message.id
        )
    session = legacy_sessions.find_session(session_id.strip(), caller)
    if session is None:
        return _no_session(message.id)
    legacy_sessions.touch(session)
    if message.is_notification:
        _notification(message, session)
        return empty_reply(202)
    call = Call(message=message, caller=caller, session=session)
    return _answered(message.id, lambda: _reply(call))


def _post_response(session_id: str | None, data: dict[str, Any], caller: Caller) -> WireReply:
    session = legacy_sessions.find_session((session_id or "").strip(), caller)
    if session is None:
        return _no_session()
    legacy_sessions.touch(session)
    try:
        return _client_response(data, caller, session)
    except ProtocolError as exc:  # the answer cannot be accepted
        return error_reply(exc, status=exc.http_status or 400)


def _answered(request_id: Any, serve: Callable[[], WireReply]) -> WireReply:
    """JSON-RPC errors are answered with HTTP 200 (the status of the exchange,
    not of the call), except where a limit names its own status."""
    try:
        return serve()
    except ProtocolError as exc:
        return error_reply(exc, request_id, status=exc.http_status or 200)


def handle_session_request(method: str, session_id: str | None, caller: Caller) -> WireReply:
    """GET (the session's stream) or DELETE (end the session)."""
    session = legacy_sessions.find_session((session_id or "").strip(), caller)
    if session is None:
        return _no_session()
    if method == "DELETE":
        legacy_sessions.close_session(session)
        return empty_reply(200)
    legacy_sessions.touch(session)
    return stream_reply(Stream(legacy_streams.session_stream(session.pk)))


# Session lifecycle ----------------------------------------------------------------------------------


def server_capabilities(version: str) -> dict[str, Any]:
    list_changed = bool(settings.NOTIFICATIONS and getattr(django_settings, "CHANNEL_LAYERS", None))
    capabilities: dict[str, Any] = {
        "tools": {"listChanged": list_changed},
        "resources": {"subscribe": True},
        "prompts": {"listChanged": list_changed},
        "completions": {},
        "logging": {},
    }
    if version == TASKS_VERSION:
        capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    return capabilities


def _initialize(message: jsonrpc.Message, caller: Caller) -> WireReply:
    params = message.params
    requested = params.get("protocolVersion")
    if not isinstance(requested, str):
        raise InvalidParams('initialize needs "protocolVersion" (a string)')
    capabilities = params.get("capabilities", {})
    client_info = params.get("clientInfo", {})
    if not isinstance(capabilities, dict) or not isinstance(client_info, dict):
        raise InvalidParams('"capabilities" and "clientInfo" must be objects')
    # The requested version if we speak it, else our latest (the client decides).
    version = requested if requested in LEGACY_VERSIONS else LATEST_VERSION
    session = legacy_sessions.open_session(caller, version, capabilities, client_info)
    result: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": server_capabilities(version),
        "serverInfo": server_info(),
    }
    if settings.INSTRUCTIONS:
        result["instructions"] = settings.INSTRUCTIONS
    return message_reply(jsonrpc.result(message.id, result), headers={SESSION_HEADER: session.pk})


def _notification(message: jsonrpc.Message, session: LegacySession) -> None:
    if message.method == "notifications/initialized":
        legacy_sessions.mark_initialized(session)
    elif message.method == "notifications/cancelled":
        request_id = message.params.get("requestId")
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
            group = legacy_sessions.call_group(session.pk, request_id)
            legacy_streams.deliver(group, {"session": session.pk, "cancel": True})
    # Anything else (progress, roots/list_changed, ...) needs nothing from us.


def _client_response(data: dict[str, Any], caller: Caller, session: LegacySession) -> WireReply:
    """The client answers one of our requests: route it to what waits for it."""
    parsed = legacy_streams.parse_request_id(data.get("id"))
    if parsed is None:
        return empty_reply(202)  # not one of ours (or long stale): nothing waits
    kind, ref, key = parsed
    if "error" in data:
        answer: dict[str, Any] = {"error": data["error"] if isinstance(data["error"], dict) else {}}
    else:
        answer = {"result": data.get("result")}
    if kind == legacy_streams.CALL_PREFIX:
        if _TOKEN.fullmatch(ref):
            legacy_streams.deliver(f"mcptasks.lcall.{ref}", {"session": session.pk, "key": key, **answer})
        return empty_reply(202)
    task = legacy_sessions.visible_tasks(caller, session).filter(pk=ref).first()
    pending = InputRequest.objects.filter(task_id=ref, key=key).first() if task is not None else None
    if task is None or pending is None:
        return _http_error(400, "Unknown request id: no input request of yours has it")
    authorization.require_task(caller, task)
    limits.throttle("update", caller.owner)
    actor = lifecycle.client_actor(caller.owner)
    if "error" in answer:
        if pending.state == InputRequestState.PENDING:
            error = answer["error"]
            code = error.get("code") if isinstance(error.get("code"), int) else INTERNAL_ERROR
            message = f"The client could not answer {pending.method}: {error.get('message', 'error')}"
            lifecycle.fail(task.id, {"code": code, "message": message}, actor=actor)
        return empty_reply(202)
    result = answer["result"]
    request_limits.check_size(result, settings.MAX_INPUT_RESPONSES_BYTES, "result")
    validate_input_response(pending.method, key, result)
    lifecycle.submit_input(task.id, {key: result}, actor=actor)
    return empty_reply(202)


# Requests -----------------------------------------------------------------------------------------


def _reply(call: Call) -> WireReply:
    handler = HANDLERS.get(call.message.method)
    if handler is None or (call.message.method in _TASK_METHODS and not call.tasks_enabled):
        raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {call.message.method}")
    return result_reply(call.message.id, handler(call))


def ping(call: Call) -> Reply:
    return {}


def set_level(call: Call) -> Reply:
    level = call.params.get("level")
    if level not in LOG_LEVELS:
        raise InvalidParams(f'"level" must be one of {", ".join(LOG_LEVELS)}')
    LegacySession.objects.filter(pk=call.session.pk).update(log_level=level)
    return {}


# Tools ------------------------------------------------------------------------------------------------


def list_tools(call: Call) -> Reply:
    if call.params.get("cursor") is not None:
        raise InvalidParams("Invalid cursor: every tool is on the first page")
    tools = []
    for tool in registry.all():
        data = tool.describe()
        if call.tasks_enabled:
            data["execution"] = {"taskSupport": _TASK_SUPPORT[tool.task]}
        elif tool.task == "required":
            continue  # only callable as a task, which this version cannot do
        tools.append(data)
    return {"tools": tools}


def call_tool(call: Call) -> Reply:
    tool, arguments, kwargs = modern.resolve_tool_call(call.params, call.caller.owner)
    authorization.require_tool(call.caller, tool)
    name = tool.name
    # Sessions without tasks ignore params.task, as the spec asks of a
    # receiver that did not declare task support.
    task = call.params.get("task") if call.tasks_enabled else None
    if task is not None:
        if tool.task == "never":
            raise ProtocolError(METHOD_NOT_FOUND, f"Tool '{name}' does not support task-augmented execution")
        return _create_task(call, tool, arguments, task)
    if tool.task == "required":
        if call.tasks_enabled:
            raise ProtocolError(
                METHOD_NOT_FOUND, f"Tool '{name}' requires task-augmented execution: call it with params.task"
            )
        raise ProtocolError(
            METHOD_NOT_FOUND, f"Tool '{name}' runs only as a task, which protocol version {call.version} does not have"
        )

    def run(answers: dict[str, Any], notify: Any, cancel: Any) -> dict[str, Any]:
        ctx = tool_context(
            owner=call.caller.owner,
            user=call.caller.user,
            capabilities=call.session.client_capabilities,
            answers=answers,
            cancel_event=cancel,
            notify=notify,
            progress_token=call.meta.get("progressToken"),
            log_level=call.session.log_level or None,
        )
        return invoke(tool, ctx, kwargs)

    notifies = call.meta.get("progressToken") is not None or bool(call.session.log_level)
    return _replayable(call, run, stream_at_once=notifies)


def _create_task(call: Call, tool: Tool, arguments: dict[str, Any], meta: Any) -> Reply:
    if not isinstance(meta, dict):
        raise InvalidParams('"task" must be an object')
    ttl = meta.get("ttl")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0):
        raise InvalidParams('"task.ttl" must be a non-negative integer (milliseconds)')
    token = legacy_sessions.progress_token(call.meta)
    capabilities = call.session.client_capabilities
    with transaction.atomic():
        task = now(
            task_methods.create(
                THREAD, call.caller.owner, tool, arguments, era=Era.LEGACY, capabilities=capabilities, ttl_ms=ttl
            )
        )
        legacy_sessions.link_task(task, call.session, token=token)
    # Committed: tasks/get for this id works from here on.
    return {
        "task": task_object(task),
        "_meta": {
            **related(task.id),
            IMMEDIATE_RESPONSE: f"Started '{tool.name}' as task {task.id}; its result will follow when it finishes.",
        },
    }


def _replayable(call: Call, run: legacy_streams.Run, *, stream_at_once: bool) -> Reply:
    """Answer ``run`` within the request. It runs here first unless it will
    notify; if it asks the client something, the response becomes an SSE
    stream that sends the questions and runs it again with the answers."""
    adapted = _adapt_questions(call, run)
    questions = None
    if not stream_at_once:
        try:
            return adapted({}, None, None)
        except InputNeeded as need:
            questions = need.requests
    assert call.message.id is not None  # a request: notifications never reach a handler
    return Stream(
        legacy_streams.call_stream(
            request_id=call.message.id,
            session_id=call.session.pk,
            run=adapted,
            first_questions=questions,
            may_ask=call.may_ask,
        )
    )


def _adapt_questions(call: Call, run: legacy_streams.Run) -> legacy_streams.Run:
    """Before 2025-11-25 an elicitation has no ``mode`` (form is implied)."""
    if call.version == TASKS_VERSION:
        return run

    def adapted(answers: dict[str, Any], notify: Any, cancel: Any) -> dict[str, Any]:
        try:
            return run(answers, notify, cancel)
        except InputNeeded as need:
            for request in need.requests.values():
                params = request.get("params")
                if (
                    request.get("method") == "elicitation/create"
                    and isinstance(params, dict)
                    and params.get("mode") == "form"
                ):
                    request["params"] = {k: v for k, v in params.items() if k != "mode"}
            raise

    return adapted


# Prompts, resources, completion: the catalogue's, as 2025 answers them ------------------------------------


def list_prompts(call: Call) -> Reply:
    return catalog.list_prompts(call.params)


def get_prompt(call: Call) -> Reply:
    def run(answers: dict[str, Any], notify: Any, cancel: Any) -> dict[str, Any]:
        params = dict(call.params)
        if answers:
            params["inputResponses"] = answers
        result = modern.get_prompt(call.modern_request(params))
        if isinstance(result, Deferred):  # run here: this era has no hang-up rule
            result = result.compute()
        assert isinstance(result, dict)
        if result.get("resultType") == "input_required":
            raise InputNeeded(result["inputRequests"])
        return legacy_result(result)

    return _replayable(call, run, stream_at_once=False)


def list_resources(call: Call) -> Reply:
    return catalog.list_resources(call.params)


def list_resource_templates(call: Call) -> Reply:
    return catalog.list_resource_templates(call.params)


def read_resource(call: Call) -> Reply:
    uri = call.params.get("uri")
    if isinstance(uri, str) and registry.find_resource(uri) is None:
        raise ProtocolError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
    return catalog.read_resource(call.params)


def _subscription_uri(call: Call) -> str:
    uri = call.params.get("uri")
    if not isinstance(uri, str) or not uri:
        raise InvalidParams('"uri" (a string) is required')
    return uri


def subscribe(call: Call) -> Reply:
    """Accepted and remembered; our resources never change, so no
    ``notifications/resources/updated`` follows."""
    uri = _subscription_uri(call)
    with transaction.atomic():
        session = LegacySession.objects.select_for_update().get(pk=call.session.pk)
        if uri not in session.resource_subscriptions:
            session.resource_subscriptions = [*session.resource_subscriptions, uri][-1000:]
            session.save(update_fields=["resource_subscriptions"])
    return {}


def unsubscribe(call: Call) -> Reply:
    uri = _subscription_uri(call)
    with transaction.atomic():
        session = LegacySession.objects.select_for_update().get(pk=call.session.pk)
        if uri in session.resource_subscriptions:
            session.resource_subscriptions = [u for u in session.resource_subscriptions if u != uri]
            session.save(update_fields=["resource_subscriptions"])
    return {}


def complete_argument(call: Call) -> Reply:
    return catalog.complete_argument(call.params)


_TASK_METHODS = ("tasks/get", "tasks/result", "tasks/list", "tasks/cancel")

HANDLERS: dict[str, Callable[[Call], Reply]] = {
    "ping": ping,
    "logging/setLevel": set_level,
    "tools/list": list_tools,
    "tools/call": call_tool,
    "prompts/list": list_prompts,
    "prompts/get": get_prompt,
    "resources/list": list_resources,
    "resources/templates/list": list_resource_templates,
    "resources/read": read_resource,
    "resources/subscribe": subscribe,
    "resources/unsubscribe": unsubscribe,
    "completion/complete": complete_argument,
    "tasks/get": get_task,
    "tasks/result": task_result,
    "tasks/list": list_tasks,
    "tasks/cancel": cancel_task,
}
