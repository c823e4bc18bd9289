"""The endpoint's span: one per JSON-RPC request, on MCP's semantic conventions.

The web layer calls :func:`open_request` on the event loop before it hands
the message to a thread (the thread's copy of the context then has the span
current, so a task created there stores it), :func:`note_reply` where the
reply is known, and :func:`close_request` when it is sent. Requests answered on
the event loop report once, with :func:`served_on_loop`, except a creation
there, which opens its span first (its row stores it) and closes it as a
thread's request does.

Ours is the server span, unless an instrumentation (Django, ASGI) already
has a span active around the endpoint: then ours is an ``INTERNAL`` child of
that one, linked to the client's ``_meta`` context when that names another
trace, so a trace never has two server spans for one request.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..conf import settings
from . import NATIVE, OFF, bounds, metrics, tracing
from . import names as n


@dataclass
class RequestState:
    """What one request's span needs between its open and its close."""

    method: str
    started_ns: int
    token: Token[Context] | None
    span: trace.Span | None = None
    tool: str | None = None
    error_type: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


_current: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar("mcptasks_request", default=None)


def open_request(data: Any, headers: Mapping[str, str]) -> RequestState | None:
    """Start the request's span (``native``), or make the client's trace
    context current (``propagation``). ``None`` when there is nothing to do."""
    mode = settings.TELEMETRY
    if mode == OFF or not isinstance(data, dict):
        return None
    method = data.get("method")
    if not isinstance(method, str):
        return None  # a client's answer to a request of ours (2025 era)
    params = data.get("params")
    params = params if isinstance(params, dict) else {}
    client = _client_context(params, headers)
    if mode != NATIVE or not tracing.sdk_installed():
        if client is None:
            return None
        return RequestState(method=method, started_ns=0, token=otel_context.attach(client))
    state = RequestState(method=bounds.method(method), started_ns=time.time_ns(), token=None)
    state.attributes = _request_attributes(method, params, data.get("id"), headers)
    state.tool = state.attributes.get(n.TOOL_NAME)
    name = _span_name(method, params)
    outer = trace.get_current_span()
    if outer.get_span_context().is_valid:
        links = _links_to(client, outer.get_span_context().trace_id)
        span = tracing.tracer().start_span(name, kind=SpanKind.INTERNAL, attributes=state.attributes, links=links)
        state.span = span
        state.token = otel_context.attach(trace.set_span_in_context(span))
    else:
        span = tracing.tracer().start_span(name, context=client, kind=SpanKind.SERVER, attributes=state.attributes)
        state.span = span
        state.token = otel_context.attach(trace.set_span_in_context(span, client))
    _current.set(state)
    return state


def note_reply(body: Mapping[str, Any] | None, status: int) -> None:
    """Record the reply's outcome on the current request's span."""
    state = _current.get()
    if state is None or state.span is None:
        return
    _note(state, body, status)


def close_request(state: RequestState | None) -> None:
    """End the span, record the operation's duration, restore the context."""
    if state is None:
        return
    try:
        if state.span is not None:
            _end(state, time.time_ns())
    finally:
        if state.token is not None:
            otel_context.detach(state.token)
        _current.set(None)


def served_on_loop(
    data: Any, headers: Mapping[str, str], started_ns: int, body: Mapping[str, Any] | None, status: int
) -> None:
    """A request answered on the event loop, reported once it is answered."""
    if settings.TELEMETRY != NATIVE or not isinstance(data, dict) or not isinstance(data.get("method"), str):
        return
    if not tracing.sdk_installed():
        return
    method = data["method"]
    params = data.get("params")
    params = params if isinstance(params, dict) else {}
    attributes = _request_attributes(method, params, data.get("id"), headers)
    name = _span_name(method, params)
    outer = trace.get_current_span()
    if outer.get_span_context().is_valid:
        client = _client_context(params, headers)
        links = _links_to(client, outer.get_span_context().trace_id)
        span = tracing.tracer().start_span(
            name, kind=SpanKind.INTERNAL, attributes=attributes, links=links, start_time=started_ns
        )
    else:
        span = tracing.tracer().start_span(
            name,
            context=_client_context(params, headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=started_ns,
        )
    state = RequestState(
        method=bounds.method(method), started_ns=started_ns, token=None, span=span, attributes=attributes
    )
    _note(state, body, status)
    _end(state, time.time_ns())


def now_ns() -> int:
    return time.time_ns()


# Inside ---------------------------------------------------------------------------


def _client_context(params: Mapping[str, Any], headers: Mapping[str, str]) -> Context | None:
    """The client's trace context: ``params._meta`` first, then the HTTP
    headers; ``None`` when neither carries any (most requests: no parsing).
    Only fields within the W3C limits are read (``tracing.safe_carrier``)."""
    fields = _propagator_fields(propagate.get_global_textmap())
    meta = params.get("_meta")
    if isinstance(meta, dict) and any(name in meta for name in fields):
        carrier = tracing.safe_carrier(meta, fields)
    elif any(headers.get(name) is not None for name in fields):
        carrier = tracing.safe_carrier(headers, fields)
    else:
        return None
    return propagate.extract(carrier) if carrier else None


@functools.lru_cache(maxsize=4)
def _propagator_fields(propagator: Any) -> frozenset[str]:
    """The carrier keys the site's propagator reads (W3C: ``traceparent``,
    ``tracestate``, ``baggage``)."""
    return frozenset(propagator.fields)


def _links_to(client: Context | None, outer_trace_id: int) -> list[Link]:
    if client is None:
        return []
    client_span = trace.get_current_span(client).get_span_context()
    if client_span.is_valid and client_span.trace_id != outer_trace_id:
        return [Link(client_span)]
    return []


def _span_name(method: str, params: Mapping[str, Any]) -> str:
    """``{method} {target}``, both bounded: a method that is not MCP's and a
    tool or prompt the site did not register are ``_OTHER``."""
    if method == "tools/call" and isinstance(params.get("name"), str):
        return f"{method} {bounds.tool(params['name'])}"
    if method == "prompts/get" and isinstance(params.get("name"), str):
        return f"{method} {bounds.prompt(params['name'])}"
    return bounds.method(method)


def _request_attributes(
    method: str, params: Mapping[str, Any], request_id: Any, headers: Mapping[str, str]
) -> dict[str, Any]:
    """Every value bounded (``bounds``): the caller wrote them all."""
    attributes: dict[str, Any] = {n.MCP_METHOD: bounds.method(method)}
    version = _protocol_version(params, headers)
    if version:
        attributes[n.MCP_PROTOCOL_VERSION] = bounds.protocol_version(version)
    if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
        attributes[n.JSONRPC_REQUEST_ID] = bounds.identifier(request_id)
    name = params.get("name")
    if method == "tools/call" and isinstance(name, str):
        attributes[n.TOOL_NAME] = bounds.tool(name)
        attributes[n.OPERATION_NAME] = n.EXECUTE_TOOL
    elif method == "prompts/get" and isinstance(name, str):
        attributes[n.PROMPT_NAME] = bounds.prompt(name)
    task_id = params.get("taskId")
    if isinstance(task_id, str):
        attributes[n.TASK_ID] = bounds.identifier(task_id)
    session = headers.get("mcp-session-id")
    if session and version and version < n.SESSIONLESS_VERSION:
        attributes[n.MCP_SESSION_ID] = bounds.identifier(session)
    return attributes


def _protocol_version(params: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    header = headers.get("mcp-protocol-version")
    if header:
        return header.strip()
    meta = params.get("_meta")
    if isinstance(meta, dict):
        version = meta.get("io.modelcontextprotocol/protocolVersion")
        if isinstance(version, str):
            return version
    version = params.get("protocolVersion")  # a 2025-era initialize
    return version if isinstance(version, str) else None


def _note(state: RequestState, body: Mapping[str, Any] | None, status: int) -> None:
    span = state.span
    if span is None:
        return
    span.set_attribute(n.HTTP_STATUS_CODE, status)
    if not isinstance(body, Mapping):
        return
    error = body.get("error")
    result = body.get("result")
    if isinstance(error, Mapping):
        code = error.get("code")
        state.error_type = str(code)
        span.set_attribute(n.ERROR_TYPE, state.error_type)
        span.set_attribute(n.RPC_STATUS_CODE, state.error_type)
        if code not in n.CLIENT_ERRORS:
            span.set_status(Status(StatusCode.ERROR, bounds.text(error.get("message", ""), 200)))
    elif isinstance(result, Mapping):
        task_id = _created_task_id(result)
        if task_id is not None:
            span.set_attribute(n.TASK_ID, bounds.identifier(task_id))
        if result.get("isError") is True:
            state.error_type = n.TOOL_ERROR
            span.set_attribute(n.ERROR_TYPE, n.TOOL_ERROR)
            span.set_status(Status(StatusCode.ERROR, "the tool reported an error"))


def _created_task_id(result: Mapping[str, Any]) -> str | None:
    """The task a ``tools/call`` created: the 2026 result names it at its
    top level, the 2025 one under ``task``."""
    if result.get("resultType") == "task" and isinstance(result.get("taskId"), str):
        return str(result["taskId"])
    task = result.get("task")
    if isinstance(task, Mapping) and isinstance(task.get("taskId"), str):
        return str(task["taskId"])
    return None


def _end(state: RequestState, end_ns: int) -> None:
    assert state.span is not None
    state.span.end(end_time=end_ns)
    metrics.operation_finished(state.method, state.tool, state.error_type, (end_ns - state.started_ns) / 1e9)
