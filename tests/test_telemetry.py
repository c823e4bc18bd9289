"""OpenTelemetry in this process: the endpoint's spans on both eras, the
run's span tied to the creating request's trace, the input rounds' events,
the error rules, the modes, and the metrics (the SDK's in-memory exporter
and reader; tests/support/otel.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.urls import path
from django.utils import timezone
from opentelemetry import baggage as otel_baggage
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from mcptasks import ToolContext
from mcptasks.models import Task
from mcptasks.tasks import lifecycle
from mcptasks.tasks.dispatch import Route
from mcptasks.telemetry import bounds, metrics, runs, scrape, tracing
from mcptasks.tools.registry import registry
from mcptasks.worker import dispatch, execution, queue_depth, runner
from tests.support.factories import make_task, waiting_task
from tests.support.legacy import DjangoLegacy
from tests.support.otel import Recorder, fresh
from tests.support.rpc import TASKS_CAPS

pytestmark = [pytest.mark.django_db(transaction=True)]

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
OTHER_TRACEPARENT = "00-11111111111111111111111111111111-2222222222222222-01"


@pytest.fixture
def otel() -> Iterator[Recorder]:
    yield from fresh()


def run(task_id: str) -> str:
    """One run, as the Celery job makes it."""
    return runs.traced(execution.run_task, task_id)


def hex_trace(span) -> str:
    return format(span.context.trace_id, "032x")


def only(rec: Recorder, name: str):
    spans = rec.named(name)
    assert len(spans) == 1, [s.name for s in rec.finished()]
    return spans[0]


# The 2026-07-28 era ----------------------------------------------------------------


def test_a_task_s_runs_and_polls_share_the_client_s_trace(rpc, otel, transition_paths):
    created_before = otel.total("mcptasks.task.created", **{"gen_ai.tool.name": "failing_job"})
    reply = rpc.call_tool("failing_job", meta_extra={"traceparent": CLIENT_TRACEPARENT})
    task_id = reply.result["taskId"]

    call = only(otel, "tools/call failing_job")
    assert call.kind == SpanKind.SERVER
    assert hex_trace(call) == CLIENT_TRACE
    assert format(call.parent.span_id, "016x") == CLIENT_SPAN
    attributes = dict(call.attributes)
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["mcp.protocol.version"] == "2026-07-28"
    assert attributes["jsonrpc.request.id"] == str(reply.request["id"])
    assert attributes["gen_ai.tool.name"] == "failing_job"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["mcptasks.task.id"] == task_id
    assert "mcp.session.id" not in attributes and "error.type" not in attributes
    # The row keeps the creating span's context: what a redelivered run reads.
    traceparent = Task.objects.get(pk=task_id).trace_context["traceparent"]
    assert traceparent == f"00-{CLIENT_TRACE}-{format(call.context.span_id, '016x')}-01"

    # failing_job ends with a tool error: completed on the wire, an error in its run's telemetry.
    assert run(task_id) == "tool_error"
    run_span = only(otel, "execute_tool failing_job")
    assert run_span.kind == SpanKind.CONSUMER
    assert hex_trace(run_span) == CLIENT_TRACE
    assert run_span.parent.span_id == call.context.span_id
    assert run_span.attributes["mcptasks.task.id"] == task_id
    assert run_span.attributes["mcptasks.run.attempt"] == 1
    assert run_span.attributes["mcptasks.run.outcome"] == "tool_error"
    assert run_span.attributes["error.type"] == "tool_error"
    assert [e.name for e in run_span.events] == ["mcptasks.run.outcome"]

    poll = rpc.tasks_get(task_id)
    assert poll.result["status"] == "completed"
    get_span = only(otel, "tasks/get")
    assert get_span.attributes["mcptasks.task.id"] == task_id

    tool = {"gen_ai.tool.name": "failing_job"}
    assert otel.total("mcptasks.task.created", **tool) - created_before == 1
    assert otel.total("mcptasks.task.started", **tool) >= 1
    assert otel.total("mcptasks.task.completed", **tool, **{"mcptasks.task.outcome": "tool_error"}) >= 1
    assert otel.total("mcptasks.task.queue.wait", **tool) >= 1
    assert otel.total("mcptasks.task.run.duration", **tool, **{"mcptasks.run.outcome": "tool_error"}) >= 1
    assert otel.total("mcp.server.operation.duration", **{"mcp.method.name": "tools/call", **tool}) >= 1
    assert otel.total("mcp.server.operation.duration", **{"mcp.method.name": "tasks/get"}) >= 1


def test_meta_trace_context_comes_before_the_headers(rpc, otel):
    rpc.request(
        "tools/list", meta_extra={"traceparent": CLIENT_TRACEPARENT}, headers={"traceparent": OTHER_TRACEPARENT}
    )
    assert hex_trace(only(otel, "tools/list")) == CLIENT_TRACE
    otel.clear()
    rpc.request("tools/list", headers={"traceparent": OTHER_TRACEPARENT})
    assert hex_trace(only(otel, "tools/list")) == "1" * 32


def test_input_rounds_are_events_of_runs_in_one_trace(rpc, otel):
    task_id = rpc.call_tool("multi_input", meta_extra={"traceparent": CLIENT_TRACEPARENT}).result["taskId"]
    creating = only(otel, "tools/call multi_input")
    assert run(task_id) == "input_required"
    answer = {"action": "accept", "content": {"name": "x"}}
    update = rpc.request("tasks/update", {"taskId": task_id, "inputResponses": {"first": answer, "second": answer}})
    assert update.ok, update
    assert only(otel, "tasks/update").attributes["mcptasks.task.id"] == task_id
    assert run(task_id) == "completed"
    first, second = sorted(otel.named("execute_tool multi_input"), key=lambda s: s.start_time)
    for span in (first, second):
        assert span.parent.span_id == creating.context.span_id and hex_trace(span) == CLIENT_TRACE
    asked = [e for e in first.events if e.name == "mcptasks.input.asked"]
    assert [tuple(e.attributes["mcptasks.input.keys"]) for e in asked] == [("first", "second")]
    assert first.attributes["mcptasks.run.outcome"] == "input_required"
    answered = [e for e in second.events if e.name == "mcptasks.input.answered"]
    assert [tuple(e.attributes["mcptasks.input.keys"]) for e in answered] == [("first", "second")]
    assert second.attributes["mcptasks.run.outcome"] == "completed"


def test_client_errors_are_not_server_errors(rpc, otel):
    rpc.validate = False
    assert rpc.request("no/such/method").error["code"] == -32601
    span = only(otel, "_OTHER")  # not an MCP method: one fixed name, whatever the caller sent
    assert span.attributes["mcp.method.name"] == "_OTHER"
    assert span.attributes["error.type"] == "-32601"
    assert span.attributes["rpc.response.status_code"] == "-32601"
    assert span.status.status_code == StatusCode.UNSET
    assert rpc.call_tool("greet", {"name": 3}).error["code"] == -32602
    assert only(otel, "tools/call greet").status.status_code == StatusCode.UNSET
    points = otel.points("mcp.server.operation.duration")
    assert any(p.attributes.get("error.type") == "-32601" for p in points)


def test_a_tool_error_and_a_server_error_are_errors(rpc, otel):
    assert rpc.call_tool("test_error_handling").result["isError"] is True
    span = only(otel, "tools/call test_error_handling")
    assert span.attributes["error.type"] == "tool_error"
    assert span.status.status_code == StatusCode.ERROR
    task_id = rpc.call_tool("protocol_error_job").result["taskId"]
    assert run(task_id) == "failed"
    run_span = only(otel, "execute_tool protocol_error_job")
    assert run_span.status.status_code == StatusCode.ERROR
    otel.clear()
    failed = rpc.tasks_get(task_id).result
    assert failed["status"] == "failed"
    assert only(otel, "tasks/get").status.status_code == StatusCode.UNSET  # the poll itself succeeded


def test_an_instrumentation_s_server_span_keeps_ours_internal(rpc, otel):
    outer_tracer = trace.get_tracer("an.instrumentation")
    with outer_tracer.start_as_current_span("POST /mcp", kind=SpanKind.SERVER) as outer:
        rpc.request("tools/list", meta_extra={"traceparent": CLIENT_TRACEPARENT})
    ours = only(otel, "tools/list")
    assert ours.kind == SpanKind.INTERNAL
    assert ours.parent.span_id == outer.get_span_context().span_id
    assert [format(link.context.trace_id, "032x") for link in ours.links] == [CLIENT_TRACE]
    assert [s.kind for s in otel.finished()].count(SpanKind.SERVER) == 1


def test_run_links_mode_starts_a_linked_trace(rpc, otel, settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "TELEMETRY_RUN_LINKS": True}
    task_id = rpc.call_tool("failing_job", meta_extra={"traceparent": CLIENT_TRACEPARENT}).result["taskId"]
    call = only(otel, "tools/call failing_job")
    run(task_id)
    run_span = only(otel, "execute_tool failing_job")
    assert run_span.parent is None and hex_trace(run_span) != CLIENT_TRACE
    assert [link.context.span_id for link in run_span.links] == [call.context.span_id]


# Modes ---------------------------------------------------------------------------------


def test_off_records_nothing_and_keeps_no_context(rpc, otel, settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "TELEMETRY": "off"}
    created = otel.total("mcptasks.task.created")
    task_id = rpc.call_tool("failing_job", meta_extra={"traceparent": CLIENT_TRACEPARENT}).result["taskId"]
    run(task_id)
    rpc.tasks_get(task_id)
    assert otel.finished() == []
    assert Task.objects.get(pk=task_id).trace_context is None
    assert otel.total("mcptasks.task.created") == created


def test_propagation_carries_the_client_s_context_to_the_run(rpc, otel, settings, temp_tool):
    settings.MCPTASKS = {**settings.MCPTASKS, "TELEMETRY": "propagation"}
    seen: list[str] = []

    @temp_tool(task="required", description="Notes the current trace.")
    def note_trace() -> str:
        seen.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
        return "ok"

    task_id = rpc.call_tool("note_trace", meta_extra={"traceparent": CLIENT_TRACEPARENT}).result["taskId"]
    assert Task.objects.get(pk=task_id).trace_context["traceparent"] == CLIENT_TRACEPARENT
    assert run(task_id) == "completed"
    assert seen == [CLIENT_TRACE]
    assert otel.finished() == []


# The 2025-11-25 era ----------------------------------------------------------------


def test_legacy_calls_carry_their_session_and_the_run_joins_the_trace(client, otel):
    session = DjangoLegacy(client)
    session.initialize()
    assert only(otel, "initialize").attributes["mcp.protocol.version"] == "2025-11-25"
    otel.clear()
    reply = session.call_tool(
        "slow_compute", {"seconds": 0, "label": "old"}, task={"ttl": 60_000}, _meta={"traceparent": CLIENT_TRACEPARENT}
    )
    task_id = reply.result["task"]["taskId"]
    call = only(otel, "tools/call slow_compute")
    assert call.kind == SpanKind.SERVER and hex_trace(call) == CLIENT_TRACE
    assert call.attributes["mcp.protocol.version"] == "2025-11-25"
    assert call.attributes["mcp.session.id"] == session.session_id
    assert call.attributes["mcptasks.task.id"] == task_id
    assert run(task_id) == "completed"
    assert only(otel, "execute_tool slow_compute").parent.span_id == call.context.span_id
    session.request("tasks/get", {"taskId": task_id})
    assert only(otel, "tasks/get").attributes["mcptasks.task.id"] == task_id
    assert session.request("no/such").error["code"] == -32601
    assert only(otel, "_OTHER").status.status_code == StatusCode.UNSET


# Metrics ----------------------------------------------------------------------------------


def test_gauges_read_the_counter_table_and_the_waiting_tasks(otel):
    make_task(tool="slow_compute")
    waiting_task()
    readings = {o.attributes["mcptasks.task.status"]: o.value for o in metrics.active_tasks()}
    assert readings == {"working": 1, "input_required": 1}


def test_the_queue_depth_gauge_reads_the_broker(otel):
    queue = queue_depth.run_queues()[0]
    task = make_task(tool="slow_compute")
    before = {o.attributes["messaging.destination.name"]: o.value for o in queue_depth.depths()}
    dispatch.enqueue_run(task.id, Route(queue))
    after = {o.attributes["messaging.destination.name"]: o.value for o in queue_depth.depths()}
    assert after[queue] == before.get(queue, 0) + 1


def test_cancelled_and_expired_tasks_are_counted(otel):
    task = make_task(tool="slow_compute")
    cancelled = otel.total("mcptasks.task.cancelled", **{"gen_ai.tool.name": "slow_compute"})
    expired = otel.total("mcptasks.task.expired")
    assert lifecycle.cancel(task.id, actor="client:alice")
    Task.objects.filter(pk=task.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.prune_expired() == 1
    assert otel.total("mcptasks.task.cancelled", **{"gen_ai.tool.name": "slow_compute"}) - cancelled == 1
    assert otel.total("mcptasks.task.expired") - expired == 1


def test_run_and_its_children_get_the_otel_environment(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "site")
    env = runner.child_environment("project")
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318" and env["OTEL_SERVICE_NAME"] == "site"
    assert os.environ["OTEL_SERVICE_NAME"] == "site"


def test_a_poll_has_its_span_on_either_path(poll_rpc, otel):
    task_id = poll_rpc.call_tool("failing_job").result["taskId"]
    otel.clear()
    reply = poll_rpc.request("tasks/get", {"taskId": task_id}, meta_extra={"traceparent": CLIENT_TRACEPARENT})
    assert reply.result["status"] == "working"
    span = only(otel, "tasks/get")
    assert span.kind == SpanKind.SERVER and hex_trace(span) == CLIENT_TRACE
    assert span.attributes["mcptasks.task.id"] == task_id
    assert span.attributes["mcp.method.name"] == "tasks/get"
    assert otel.total("mcp.server.operation.duration", **{"mcp.method.name": "tasks/get"}) >= 1


def test_a_creation_and_a_cancel_are_traced_and_counted_on_either_path(poll_rpc, otel, loop_served):
    """On the event loop as on a thread: the creation's span is current while
    the row is written (the row keeps it), and the counters move once."""
    from tests.support.asgi import AsgiRpc

    tool = {"gen_ai.tool.name": "slow_compute"}
    created, cancelled = otel.total("mcptasks.task.created", **tool), otel.total("mcptasks.task.cancelled", **tool)
    otel.clear()
    reply = poll_rpc.call_tool(
        "slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS, meta_extra={"traceparent": CLIENT_TRACEPARENT}
    )
    task = Task.objects.get(pk=reply.result["taskId"])
    span = only(otel, "tools/call slow_compute")
    assert span.kind == SpanKind.SERVER and hex_trace(span) == CLIENT_TRACE
    assert span.attributes["mcptasks.task.id"] == task.id
    assert task.trace_context["traceparent"].split("-")[1:3] == [CLIENT_TRACE, format(span.context.span_id, "016x")]
    assert otel.total("mcptasks.task.created", **tool) - created == 1
    assert poll_rpc.tasks_cancel(task.id).result["resultType"] == "complete"
    assert only(otel, "tasks/cancel").attributes["mcptasks.task.id"] == task.id
    assert otel.total("mcptasks.task.cancelled", **tool) - cancelled == 1
    if isinstance(poll_rpc, AsgiRpc):
        assert len(loop_served) == 2, "both were served on the event loop"


# The Prometheus scrape view ------------------------------------------------------


#: Mounted as a site would (the test URLconf below).
urlpatterns = [path("metrics", scrape.metrics_view)]


def test_the_scrape_view_is_for_staff_or_the_token(client, otel, settings, django_user_model):
    settings.ROOT_URLCONF = __name__
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "s3cret-token"}
    make_task(tool="slow_compute")
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 404
    by_token = client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert by_token.status_code == 200 and b"mcptasks_task_created" in by_token.content
    user = django_user_model.objects.create_user("plain", password="pw")
    client.force_login(user)
    assert client.get("/metrics").status_code == 404
    user.is_staff = True
    user.save()
    by_staff = client.get("/metrics")
    assert by_staff.status_code == 200 and b"mcptasks_task_created" in by_staff.content


def test_a_celery_instrumentation_s_span_is_linked_not_the_parent(rpc, otel):
    task_id = rpc.call_tool("failing_job", meta_extra={"traceparent": CLIENT_TRACEPARENT}).result["taskId"]
    call = only(otel, "tools/call failing_job")
    with trace.get_tracer("a.celery.instrumentation").start_as_current_span(
        "run/mcptasks.run_task", kind=SpanKind.CONSUMER
    ) as job:
        run(task_id)
    run_span = only(otel, "execute_tool failing_job")
    assert run_span.parent.span_id == call.context.span_id
    assert [link.context.span_id for link in run_span.links] == [job.get_span_context().span_id]


def test_native_without_an_sdk_still_carries_the_client_s_context(rpc, otel, monkeypatch):
    monkeypatch.setattr(tracing, "sdk_installed", lambda: False)
    task_id = rpc.call_tool("failing_job", meta_extra={"traceparent": CLIENT_TRACEPARENT}).result["taskId"]
    assert Task.objects.get(pk=task_id).trace_context["traceparent"] == CLIENT_TRACEPARENT
    assert run(task_id) == "tool_error"
    assert otel.finished() == []


# Untrusted callers (issue 26) -----------------------------------------------------------


def _every_value(span) -> list[str]:
    """The span's name, its attributes' values and its status, as text."""
    values = [span.name, str(span.status.description or "")]
    for value in dict(span.attributes).values():
        values.extend(str(v) for v in value) if isinstance(value, tuple) else values.append(str(value))
    return values


def _label_sets(rec: Recorder, metric: str) -> set[tuple]:
    return {tuple(sorted(p.attributes.items())) for p in rec.points(metric)}


def test_a_stranger_cannot_grow_spans_or_series_on_either_path(poll_rpc, otel):
    """Random long methods, an unknown tool, long ids and headers: every
    span value is bounded, and the series are the registered tools' and
    MCP's methods' whatever the callers sent."""
    poll_rpc.validate = False
    for n in range(6):
        poll_rpc.request(f"m{n}/" + os.urandom(10_000).hex(), request_id="i" * 20_000)
        poll_rpc.call_tool(f"t{n}" + "x" * 20_000, headers={"Mcp-Name": None})
        poll_rpc.request("tasks/get", {"taskId": "k" * 30_000}, headers={"Mcp-Name": None})
        poll_rpc.request("tasks/cancel", {"taskId": f"c{n}" * 9_000}, headers={"Mcp-Name": None})
        poll_rpc.request("prompts/get", {"name": f"p{n}" * 9_000}, headers={"Mcp-Name": None})
        poll_rpc.request("server/discover", headers={"MCP-Protocol-Version": "v" * 5_000})
    spans = otel.finished()
    assert len(spans) >= 36
    longest = max((value for span in spans for value in _every_value(span)), key=len)
    assert len(longest) <= 256, longest[:80]
    methods = {span.attributes["mcp.method.name"] for span in spans}
    assert methods <= {"_OTHER", "tools/call", "tasks/get", "tasks/cancel", "prompts/get", "server/discover"}
    assert "_OTHER" in methods
    assert {s.name for s in spans} <= {
        "_OTHER",
        "tools/call _OTHER",
        "tasks/get",
        "tasks/cancel",
        "prompts/get _OTHER",
        "server/discover",
    }
    assert {s.attributes.get("mcp.protocol.version") for s in spans} <= {"2026-07-28", "_OTHER"}
    series = _label_sets(otel, "mcp.server.operation.duration")
    recorded_methods = {dict(labels)["mcp.method.name"] for labels in series}
    recorded_tools = {dict(labels).get("gen_ai.tool.name") for labels in series} - {None}
    assert recorded_methods <= bounds.MCP_METHODS | {"_OTHER"}
    assert recorded_tools <= {t.name for t in registry.all()} | {"_OTHER"}
    assert all(len(str(v)) <= 256 for labels in series for _k, v in labels)


def test_a_stranger_cannot_grow_spans_on_the_2025_era(client, otel):
    session = DjangoLegacy(client, validate=False)
    session.initialize()
    otel.clear()
    session.request("x/" + "y" * 50_000)
    session.request("tasks/get", {"taskId": "z" * 50_000})
    session.request("tools/call", {"name": "q" * 50_000, "arguments": {}})
    session.post(
        {"jsonrpc": "2.0", "id": "r" * 50_000, "method": "ping"},
        extra={"Mcp-Session-Id": "s" * 50_000},
    )
    spans = otel.finished()
    assert len(spans) == 4
    assert max(len(value) for span in spans for value in _every_value(span)) <= 256
    assert {s.name for s in spans} == {"_OTHER", "tasks/get", "tools/call _OTHER", "ping"}
    ping = only(otel, "ping")
    assert len(ping.attributes["jsonrpc.request.id"]) == bounds.MAX_ID_CHARS
    assert len(ping.attributes["mcp.session.id"]) == bounds.MAX_ID_CHARS


def test_the_bounds_are_one_helper_the_run_span_and_task_metrics_use_too(rpc, otel):
    tool_label = {"gen_ai.tool.name": "slow_compute"}
    before = otel.total("mcptasks.task.created", **tool_label)
    task = make_task(tool="slow_compute")
    assert otel.total("mcptasks.task.created", **tool_label) - before == 1
    # A row whose tool was unregistered since (or written by hand) is _OTHER, never its name.
    Task.objects.filter(pk=task.id).update(tool_name="gone" + "g" * 100)
    metrics.run_finished("gone" + "g" * 100, "completed", 0.1)
    outcome = {"mcptasks.run.outcome": "completed"}
    assert otel.total("mcptasks.task.run.duration", **{"gen_ai.tool.name": "_OTHER"}, **outcome) >= 1
    assert bounds.text("a\nb\x00" + "c" * 1000) == "a\ufffdb\ufffd" + "c" * 252
    assert bounds.one_of("queued", ("queued", "running")) == "queued"
    assert bounds.one_of("x" * 999, ("queued",)) == bounds.OTHER


BAD_TRACE_FIELDS = [
    {"traceparent": 1},
    {"traceparent": True},
    {"traceparent": 1.5},
    {"traceparent": [1]},
    {"traceparent": {"a": 1}},
    {"traceparent": CLIENT_TRACEPARENT, "baggage": 5},
    {"traceparent": CLIENT_TRACEPARENT, "tracestate": [1]},
]


@pytest.mark.parametrize(
    "fields", BAD_TRACE_FIELDS, ids=lambda f: "-".join(f"{k}:{type(v).__name__}" for k, v in f.items())
)
@pytest.mark.parametrize("mode", ["native", "propagation"])
def test_a_trace_field_that_is_not_a_string_is_ignored_on_every_method(poll_rpc, otel, settings, fields, mode):
    settings.MCPTASKS = {**settings.MCPTASKS, "TELEMETRY": mode}
    assert poll_rpc.request("server/discover", meta_extra=fields).status == 200
    task_id = poll_rpc.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS, meta_extra=fields)
    task_id = task_id.result["taskId"]
    assert poll_rpc.tasks_get(task_id, meta_extra=fields).result["status"] == "working"
    cancelled = poll_rpc.tasks_cancel(task_id, meta_extra=fields)
    assert cancelled.status == 200 and cancelled.result["resultType"] == "complete", cancelled
    assert Task.objects.get(pk=task_id).status == "cancelled"
    stored = Task.objects.get(pk=task_id).trace_context or {}
    if "traceparent" in fields and isinstance(fields["traceparent"], str) and mode == "propagation":
        assert stored["traceparent"] == CLIENT_TRACEPARENT  # the good field is still read
    assert "baggage" not in stored and "tracestate" not in stored


@pytest.mark.parametrize("fields", BAD_TRACE_FIELDS[:4] + BAD_TRACE_FIELDS[5:])
def test_a_trace_field_that_is_not_a_string_is_ignored_on_the_2025_era(client, otel, fields):
    session = DjangoLegacy(client)
    session.initialize()
    assert session.request("ping", {"_meta": fields}).status == 200
    task_reply = session.call_tool("slow_compute", {"seconds": 30}, task={"ttl": 60_000}, _meta=fields)
    task_id = task_reply.result["task"]["taskId"]
    assert session.request("tasks/get", {"taskId": task_id, "_meta": fields}).result["status"] == "working"
    assert session.request("tasks/cancel", {"taskId": task_id, "_meta": fields}).status == 200
    assert Task.objects.get(pk=task_id).status == "cancelled"


def test_trace_fields_past_the_w3c_limits_are_ignored_and_never_logged(rpc, otel, caplog):
    forged = "k=v\n2026-11-27 12:00:00 CRITICAL root: the admin password is hunter2"
    cases = [
        {"traceparent": CLIENT_TRACEPARENT, "tracestate": forged},
        {"traceparent": CLIENT_TRACEPARENT, "baggage": "a=" + "b" * 900_000},
        {"traceparent": CLIENT_TRACEPARENT, "tracestate": ",".join(f"k{i}=v" for i in range(33))},
        {"traceparent": CLIENT_TRACEPARENT, "tracestate": "k=" + "v" * 600},
        {"traceparent": CLIENT_TRACEPARENT + "-" + "0" * 40},
        {"traceparent": CLIENT_TRACEPARENT, "baggage": "not a member\nCRITICAL forged"},
    ]
    with caplog.at_level(logging.DEBUG):
        for fields in cases:
            otel.clear()
            assert rpc.request("server/discover", meta_extra=fields).status == 200
            span = only(otel, "server/discover")
            if len(fields["traceparent"]) == 55:
                assert hex_trace(span) == CLIENT_TRACE  # the valid field still counts
            assert not span.context.trace_state  # the bad one as if absent
        for headers in ({"traceparent": CLIENT_TRACEPARENT, "tracestate": forged}, {"baggage": "x=" + "y" * 9000}):
            assert rpc.request("server/discover", headers=headers).status == 200
    logged = [r.getMessage() for r in caplog.records]
    assert not [m for m in logged if "hunter2" in m or "forged" in m or len(m) > 1000]


def test_the_site_s_once_per_kind_log_filter_keys_on_the_format_and_never_fills():
    """Caller values in a warning made each message a kind of its own: 256 of
    them silenced every later OpenTelemetry warning of the process."""
    from tests.testapp import telemetry as site_telemetry

    loggers = [
        found
        for name, found in list(logging.Logger.manager.loggerDict.items())
        if name.startswith("opentelemetry") and isinstance(found, logging.Logger)
    ]
    before = {id(found): list(found.filters) for found in loggers}
    site_telemetry._log_drops_once(metrics.meter().create_counter("tests.dropped"))
    try:
        (once,) = [f for f in logging.getLogger("opentelemetry.trace.span").filters if f not in before[id(loggers[0])]]

        def warning(template: str, *args: object) -> logging.LogRecord:
            return logging.LogRecord("opentelemetry.trace.span", logging.WARNING, __file__, 1, template, args, None)

        passed = [once.filter(warning("Member doesn't match %s", f"k{i}=v\n{i}")) for i in range(300)]
        assert passed.count(True) == 1
        assert once.filter(warning("There can't be more 32 key/value pairs."))  # a new kind still speaks
        assert not once.filter(warning("There can't be more 32 key/value pairs."))
    finally:
        for found in loggers:
            found.filters[:] = before[id(found)]


def test_the_scrape_view_answers_404_to_a_bearer_that_is_not_ascii(client, otel, settings):
    settings.ROOT_URLCONF = __name__
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "s3cret-token"}
    for offered in ("s3cret-tökén", "\u00e9" * 20, "s3cret-token\u00a0"):
        assert client.get("/metrics", headers={"Authorization": f"Bearer {offered}"}).status_code == 404
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200


@pytest.mark.parametrize("keep", [False, True])
def test_caller_baggage_is_kept_and_handed_to_the_run_only_when_asked(rpc, client, otel, settings, temp_tool, keep):
    settings.MCPTASKS = {**settings.MCPTASKS, "TELEMETRY_KEEP_BAGGAGE": keep}
    seen: list[dict] = []

    @temp_tool(task="optional", description="Notes the run's baggage.")
    def note_baggage() -> str:
        seen.append(dict(otel_baggage.get_all()))
        return "ok"

    fields = {"traceparent": CLIENT_TRACEPARENT, "baggage": "tenant=other-tenant,role=admin"}
    modern = rpc.call_tool("note_baggage", capabilities=TASKS_CAPS, meta_extra=fields).result["taskId"]
    session = DjangoLegacy(client)
    session.initialize()
    legacy = session.call_tool("note_baggage", {}, task={"ttl": 60_000}, _meta=fields).result["task"]["taskId"]
    for task_id in (modern, legacy):
        stored = Task.objects.get(pk=task_id).trace_context
        assert stored["traceparent"].split("-")[1] == CLIENT_TRACE
        assert ("baggage" in stored) is keep
        assert run(task_id) == "completed"
    expected = {"tenant": "other-tenant", "role": "admin"} if keep else {}
    assert seen == [expected, expected]


def test_a_row_s_stored_baggage_is_not_handed_to_the_run_unless_asked(otel, temp_tool):
    seen: list[dict] = []

    @temp_tool(task="required", description="Notes the run's baggage.")
    def note_row_baggage() -> str:
        seen.append(dict(otel_baggage.get_all()))
        return "ok"

    task = make_task(tool="note_row_baggage")
    Task.objects.filter(pk=task.id).update(
        trace_context={"traceparent": CLIENT_TRACEPARENT, "baggage": "role=admin", "tracestate": "k=v\nforged"}
    )
    assert run(task.id) == "completed"
    assert seen == [{}]
    assert hex_trace(only(otel, "execute_tool note_row_baggage")) == CLIENT_TRACE


def test_a_tool_retry_has_a_metric_of_its_own_and_runs_carry_their_queue_and_tool_attempt(otel, temp_tool):
    @temp_tool(task="required", queue="partner-api", retries=1, retry_on=(ConnectionError,), retry_backoff=0)
    def shaky_partner() -> str:
        raise ConnectionError("try again")

    task = make_task(tool="shaky_partner")
    lost = otel.total("mcptasks.task.retried", **{"gen_ai.tool.name": "shaky_partner"})
    assert run(task.id) == "retrying"
    assert run(task.id) == "tool_error"
    spans = otel.named("execute_tool shaky_partner")
    assert [s.attributes["mcptasks.tool.attempt"] for s in spans] == [1, 2]
    assert all(s.attributes["messaging.destination.name"] == "partner-api" for s in spans)
    assert [s.attributes["mcptasks.run.attempt"] for s in spans] == [1, 1]  # no run was lost
    name = {"gen_ai.tool.name": "shaky_partner", "messaging.destination.name": "partner-api"}
    assert otel.total("mcptasks.task.tool_retries", **name) == 1
    assert otel.total("mcptasks.task.retried", **{"gen_ai.tool.name": "shaky_partner"}) == lost
    assert otel.total("mcptasks.task.queue.wait", **name) == 2


@pytest.mark.parametrize("heeds", [True, False], ids=["tool-stops-at-its-check", "tool-ignores-the-stop"])
def test_a_run_ended_at_its_hard_limit_is_a_tool_error_in_its_span_as_in_the_task_counter(otel, temp_tool, heeds):
    """The limit ends the task as the tool's error; the tool then stops at
    its next check (``TaskCancelled`` in the run) or, ignoring it, returns
    later, refused: the span, the run's duration and the task's counter all
    say ``tool_error``."""

    @temp_tool(task="required", time_limit=0.4)
    def overrunning(ctx: ToolContext) -> str:
        if heeds:
            ctx.sleep(5)
        else:
            time.sleep(1.2)
        return "too late"

    tool = {"gen_ai.tool.name": "overrunning"}
    counted = otel.total("mcptasks.task.completed", **tool, **{"mcptasks.task.outcome": "tool_error"})
    task = make_task(tool="overrunning")
    assert run(task.id) == "tool_error"
    row = Task.objects.get(pk=task.id)
    assert row.result["isError"] is True and "time limit of 0.4 s" in row.result["content"][0]["text"]
    span = only(otel, "execute_tool overrunning")
    assert span.attributes["mcptasks.run.outcome"] == "tool_error"
    assert span.attributes["error.type"] == "tool_error"
    assert span.status.status_code == StatusCode.ERROR
    assert otel.total("mcptasks.task.completed", **tool, **{"mcptasks.task.outcome": "tool_error"}) - counted == 1
    assert otel.total("mcptasks.task.run.duration", **tool, **{"mcptasks.run.outcome": "tool_error"}) >= 1
    for other in ("cancelled", "completed"):
        assert otel.total("mcptasks.task.run.duration", **tool, **{"mcptasks.run.outcome": other}) == 0


def test_the_queue_depth_gauge_reads_each_tools_queue(otel, temp_tool, settings):
    @temp_tool(task="required", queue="gpu-depth")
    def gpu_depth_tool() -> str:
        return "ok"

    settings.MCPTASKS = {**settings.MCPTASKS, "TOOL_CONTROLS": {"not_registered": {"queue": "elsewhere"}}}
    assert {"gpu-depth", "elsewhere"} <= set(queue_depth.run_queues())
    task = make_task(tool="gpu_depth_tool")
    before = {o.attributes["messaging.destination.name"]: o.value for o in queue_depth.depths()}
    dispatch.enqueue_run(task.id, Route("gpu-depth"))
    after = {o.attributes["messaging.destination.name"]: o.value for o in queue_depth.depths()}
    assert after["gpu-depth"] == before.get("gpu-depth", 0) + 1
