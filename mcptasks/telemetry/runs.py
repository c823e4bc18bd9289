"""A task run's span, in the worker.

The run's span is a child of the request that created the task: its trace
context is on the task's row (``Task.trace_context``), so a run redelivered
after its worker died joins the same trace, and so does every run after an
input round. One trace then holds the client's call, each run, the
``tasks/update`` calls that answered its questions and the polls that read
its result. ``TELEMETRY_RUN_LINKS`` starts each run in a trace of its own,
linked to the creating request, instead (what
``opentelemetry-instrumentation-celery`` calls ``use_span_links``), for sites
whose backends keep traces short.

The Celery job wraps the run in :func:`traced`; ``execution`` reports the
claimed run with :func:`started` and a question with :func:`input_asked`.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from ..conf import settings
from ..models import Task
from . import NATIVE, OFF, bounds, metrics, tracing
from . import names as n


@dataclass
class RunState:
    tool: str = ""
    started: float = 0.0
    span: trace.Span | None = None
    token: Token[Context] | None = None


_current: contextvars.ContextVar[RunState | None] = contextvars.ContextVar("mcptasks_run", default=None)


def traced(run: Callable[[str], str], task_id: str) -> str:
    """``run(task_id)`` inside a run scope: :func:`started` opens the span
    when the run claims the task, and it ends here with the run's outcome."""
    if settings.TELEMETRY == OFF:
        return run(task_id)
    state = RunState()
    scope = _current.set(state)
    outcome = "crashed"
    try:
        outcome = run(task_id)
        return outcome
    except BaseException as exc:
        if state.span is not None:
            state.span.record_exception(exc)
        raise
    finally:
        _current.reset(scope)
        _finish(state, outcome)


def started(task: Task, answers: Mapping[str, Any], *, queue: str | None = None, tool_attempt: int = 1) -> None:
    """The run claimed ``task``: open its span under the creating request's
    trace (``native``) or make that trace current (``propagation``). The
    span and the queue wait carry the run's ``queue``; the span, the tool's
    attempt (retries on its ``retry_on``)."""
    state = _current.get()
    if state is None:
        return  # not inside traced(): nothing would end a span
    parent = propagate.extract(_stored_context(task))
    if settings.TELEMETRY != NATIVE or not tracing.sdk_installed():
        state.token = otel_context.attach(parent)
        return
    state.tool = task.tool_name
    state.started = time.monotonic()
    # Queue wait: from creation, or from the answers that resumed the task
    # (both set ``dispatched_at``); a run redelivered after a lost one has none.
    queued = task.dispatched_at or task.created_at
    wait = (timezone.now() - queued).total_seconds() if task.attempts <= 1 else None
    metrics.run_started(task.tool_name, task.attempts, wait, queue)
    tool = bounds.tool(task.tool_name)
    attributes: dict[str, AttributeValue] = {
        n.TOOL_NAME: tool,
        n.OPERATION_NAME: n.EXECUTE_TOOL,
        n.TASK_ID: bounds.identifier(task.id),
        n.RUN_ATTEMPT: task.attempts,
        n.TOOL_ATTEMPT: tool_attempt,
    }
    if queue:
        attributes[n.QUEUE_NAME] = queue
    links: list[Link] = []
    outer = trace.get_current_span().get_span_context()
    if outer.is_valid:
        links.append(Link(outer))  # e.g. a Celery instrumentation's span around this job
    creator = trace.get_current_span(parent).get_span_context()
    if settings.TELEMETRY_RUN_LINKS:
        if creator.is_valid:
            links.append(Link(creator))
        parent = otel_context.Context()
    span = tracing.tracer().start_span(
        f"{n.EXECUTE_TOOL} {tool}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links
    )
    if answers:
        span.add_event(n.EVENT_INPUT_ANSWERED, {n.INPUT_KEYS: [bounds.identifier(key) for key in sorted(answers)[:64]]})
    state.span = span
    state.token = otel_context.attach(trace.set_span_in_context(span, parent))


def _stored_context(task: Task) -> dict[str, str]:
    """The row's trace context, read as a client's is (rows written before
    these checks, or by hand, get no more trust), without its baggage unless
    ``TELEMETRY_KEEP_BAGGAGE``: a caller wrote it, and the run would trust it."""
    stored = task.trace_context if isinstance(task.trace_context, dict) else {}
    carrier = tracing.safe_carrier(stored, stored.keys())
    if not settings.TELEMETRY_KEEP_BAGGAGE:
        carrier.pop(tracing.BAGGAGE, None)
    return carrier


def input_asked(keys: Mapping[str, Any]) -> None:
    """The tool asked the client for input: the task waits, this run ends."""
    state = _current.get()
    if state is not None and state.span is not None:
        state.span.add_event(n.EVENT_INPUT_ASKED, {n.INPUT_KEYS: sorted(keys)})


def _finish(state: RunState, outcome: str) -> None:
    if state.token is not None:
        otel_context.detach(state.token)
    span = state.span
    if span is None:
        return
    span.set_attribute(n.RUN_OUTCOME, outcome)
    span.add_event(n.EVENT_RUN_OUTCOME, {n.RUN_OUTCOME: outcome})
    if outcome in ("failed", "crashed"):
        span.set_status(Status(StatusCode.ERROR, f"the run {outcome}"))
    elif outcome == n.TOOL_ERROR:
        # A tool's isError result: ``completed`` on the 2026-07-28 wire, an
        # error all the same (MCP's semantic conventions).
        span.set_attribute(n.ERROR_TYPE, n.TOOL_ERROR)
        span.set_status(Status(StatusCode.ERROR, "the tool returned an error result"))
    span.end()
    metrics.run_finished(state.tool, outcome, time.monotonic() - state.started)
