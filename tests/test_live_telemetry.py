"""One trace across processes: uvicorn and a separate Celery worker (Postgres,
Redis) export over OTLP/HTTP (the example site's project/telemetry.py) to a
receiver inside this test, which decodes the protobuf export requests. The
worker's run must be a child of the client's ``tools/call`` span, in the
client's trace."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mcptasks.telemetry import bounds
from mcptasks.tools.registry import registry
from tests.support import live, postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


@dataclass
class Receiver:
    """What the OTLP/HTTP receiver has decoded so far."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: set[tuple[str, str]] = field(default_factory=set)  # (service, metric name)
    #: (metric name, its data point's attributes as sorted pairs): one per series.
    series: set[tuple[str, tuple[tuple[str, Any], ...]]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for resource_spans in request.resource_spans:
                service = _service(resource_spans.resource)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            ReceivedSpan(
                                service=service,
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in span.attributes},
                            )
                        )

    def take_metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        with self.lock:
            for resource_metrics in request.resource_metrics:
                service = _service(resource_metrics.resource)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        self.metrics.add((service, metric.name))
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points if kind else []:
                            labels = tuple(sorted((a.key, _value(a.value)) for a in point.attributes))
                            self.series.add((metric.name, labels))

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _service(resource: Any) -> str:
    return next((_value(a.value) for a in resource.attributes if a.key == "service.name"), "")


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    with otlp_receiver() as served:
        yield served


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """An OTLP/HTTP receiver on a free local port: what it decoded, and its URL
    (also for tests/test_live_adoption.py)."""
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/v1/traces":
                received.take_traces(body)
            elif self.path == "/v1/metrics":
                received.take_metrics(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def otel_stack(tmp_path_factory: pytest.TempPathFactory, receiver: tuple[Receiver, str]) -> Iterator[live.LiveStack]:
    _, endpoint = receiver
    settings = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "mcptasks-live",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    stack = live.start_stack(tmp_path_factory.mktemp("otel-stack"), settings=settings)
    try:
        yield stack
    finally:
        live.teardown_stack(stack)


def test_the_worker_s_run_is_in_the_client_s_trace(otel_stack: live.LiveStack, receiver: tuple[Receiver, str]) -> None:
    received, _ = receiver
    client = HttpRpc(otel_stack.url)
    try:
        reply = client.call_tool(
            "slow_compute",
            {"seconds": 0, "label": "traced"},
            meta_extra={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        )
        task_id = reply.result["taskId"]
        assert client.wait_for(task_id, timeout=60)["status"] == "completed"
    finally:
        client.close()

    def run_span() -> ReceivedSpan | None:
        runs = [
            s for s in received.named("execute_tool slow_compute") if s.attributes.get("mcptasks.task.id") == task_id
        ]
        return runs[0] if runs else None

    def call_spans() -> list[ReceivedSpan]:
        return [s for s in received.named("tools/call slow_compute") if s.attributes.get("mcptasks.task.id") == task_id]

    run = wait_until(run_span, timeout=60, explain=lambda: f"{received.spans}\n{otel_stack.logs()}")
    # The web process exports on its own schedule: its span may arrive after the worker's.
    calls = wait_until(call_spans, timeout=60, explain=lambda: f"{received.spans}\n{otel_stack.logs()}")
    assert len(calls) == 1, received.spans
    call = calls[0]
    assert (call.trace_id, call.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert (run.trace_id, run.parent_id) == (CLIENT_TRACE, call.span_id)
    assert run.attributes["mcptasks.run.outcome"] == "completed"
    assert call.service == run.service == "mcptasks-live"
    # The worker's metrics reach the collector too.
    wait_until(
        lambda: {"mcptasks.task.started", "mcp.server.operation.duration"} <= {m for _, m in received.metrics},
        timeout=60,
        explain=lambda: f"{sorted(received.metrics)}\n{otel_stack.logs()}",
    )


@pytest.fixture(scope="module")
def threads_stack(tmp_path_factory: pytest.TempPathFactory, receiver: tuple[Receiver, str]) -> Iterator[live.LiveStack]:
    """The stack with a threads-pool worker, which never sends Celery's
    ``worker_process_init``: the site's set-up must happen in ``worker_init``."""
    _, endpoint = receiver
    settings = {
        **live.LIVE_SETTINGS,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "mcptasks-threads",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    stack = live.launch_stack(
        live.LiveStack,
        tmp_path_factory.mktemp("otel-threads-stack"),
        database_url=os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL),
        redis_url=os.environ.get("MCPTASKS_TEST_REDIS_URL", live.DEFAULT_REDIS_URL),
        settings=settings,
        name="live",
        workers=0,
    )
    try:
        node = f"threads-{stack.queue}"
        stack.start("worker-threads", live.celery_worker_argv(stack.queue, node, concurrency=2, pool="threads"))
        yield stack
    finally:
        live.teardown_stack(stack)


def test_a_threads_pool_worker_exports_its_run_spans(
    threads_stack: live.LiveStack, receiver: tuple[Receiver, str]
) -> None:
    received, _ = receiver
    client = HttpRpc(threads_stack.url)
    try:
        task_id = client.create_task("slow_compute", {"seconds": 0, "label": "threads"})
        assert client.wait_for(task_id, timeout=60)["status"] == "completed"
    finally:
        client.close()
    run = wait_until(
        lambda: next(
            (s for s in received.named("execute_tool slow_compute") if s.attributes.get("mcptasks.task.id") == task_id),
            None,
        ),
        timeout=60,
        explain=lambda: f"{received.spans}\n{threads_stack.logs()}",
    )
    assert run.service == "mcptasks-threads"
    assert run.attributes["mcptasks.run.outcome"] == "completed"
    # The run metrics leave the worker too.
    wait_until(
        lambda: ("mcptasks-threads", "mcptasks.task.run.duration") in received.metrics,
        timeout=60,
        explain=lambda: f"{sorted(received.metrics)}\n{threads_stack.logs()}",
    )


@pytest.fixture(scope="module")
def stalled_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[live.LiveStack]:
    """A stack whose collector accepts connections and never answers."""
    hole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)
    settings = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }
    stack = live.start_stack(tmp_path_factory.mktemp("stalled-otel-stack"), settings=settings)
    try:
        yield stack
    finally:
        live.teardown_stack(stack)
        hole.close()


def test_a_collector_that_never_answers_slows_nothing(stalled_stack: live.LiveStack) -> None:
    client = HttpRpc(stalled_stack.url)
    slowest = 0.0
    try:
        for n in range(10):
            started = time.monotonic()
            task_id = client.create_task("slow_compute", {"seconds": 0, "label": f"stalled-{n}"})
            assert client.wait_for(task_id, timeout=30)["status"] == "completed"
            slowest = max(slowest, time.monotonic() - started)
    finally:
        client.close()
    # Each export waits a second for the collector before it gives up; no
    # request or run waits on one.
    assert slowest < 5.0, f"a task took {slowest:.1f}s from its call to its result"
    # Each process that exported (the web process, the worker's pool
    # processes) logs a failed export once, not once per export.
    time.sleep(3)  # a few more export intervals, each failing
    logs = {name: stalled_stack.log_text(name) for name in ("web", "worker0")}
    assert logs["web"].count("Failed to export spans") == 1, logs["web"]
    assert logs["web"].count("mcptasks.telemetry telemetry: the collector did not take") == 1, logs["web"]
    pool_processes = {
        line.split("/")[1].split("]")[0] for line in logs["worker0"].splitlines() if "Failed to export spans" in line
    }
    assert 1 <= len(pool_processes) <= 2
    assert logs["worker0"].count("Failed to export spans") == len(pool_processes), logs["worker0"]


def code_below_the_docstring(path: Path) -> str:
    text = path.read_text()
    return text[text.index('"""', 3) + 3 :]


@pytest.mark.live
def test_the_test_site_sets_up_the_sdk_as_the_example_site_does() -> None:
    """The live tests run the test site; its SDK setup is the example site's."""
    repo = Path(__file__).resolve().parent.parent
    assert code_below_the_docstring(repo / "tests" / "testapp" / "telemetry.py") == code_below_the_docstring(
        repo / "project" / "telemetry.py"
    )


def test_strangers_random_method_names_grow_no_span_or_series(
    otel_stack: live.LiveStack, receiver: tuple[Receiver, str]
) -> None:
    """40 requests without credentials, each naming a random 100 kB method:
    what reaches the collector is bounded, and they add no series of their own."""
    received, _ = receiver
    tools = {t.name for t in registry.all()}
    assert tools, "the test site's tools are registered in this process too"
    client = HttpRpc(otel_stack.url)
    client.validate = False
    try:
        for n in range(40):
            reply = client.request(secrets.token_urlsafe(75_000), request_id=f"stranger-{n}")
            assert reply.error["code"] == -32601, reply
    finally:
        client.close()

    def strangers() -> list[ReceivedSpan]:
        with received.lock:
            spans = list(received.spans)
        return [s for s in spans if str(s.attributes.get("jsonrpc.request.id", "")).startswith("stranger-")]

    wait_until(lambda: len(strangers()) >= 40, timeout=60, explain=lambda: f"{len(strangers())}\n{otel_stack.logs()}")
    assert {s.name for s in strangers()} == {"_OTHER"}
    assert {s.attributes["mcp.method.name"] for s in strangers()} == {"_OTHER"}
    with received.lock:
        spans = list(received.spans)
    for span in spans:
        assert len(span.name.encode()) <= 1024, span.name[:80]
        for key, value in span.attributes.items():
            assert len(str(value).encode()) <= 1024, (span.name, key, str(value)[:80])

    def operation_series() -> list[dict[str, Any]]:
        with received.lock:
            return [dict(labels) for name, labels in received.series if name == "mcp.server.operation.duration"]

    wait_until(
        lambda: any(labels.get("mcp.method.name") == "_OTHER" for labels in operation_series()),
        timeout=60,
        explain=lambda: f"{operation_series()}\n{otel_stack.logs()}",
    )
    with received.lock:
        every_series = list(received.series)
    for name, labels in every_series:
        for key, value in labels:
            assert len(str(value).encode()) <= 1024, (name, key, str(value)[:80])
    methods = {labels["mcp.method.name"] for labels in operation_series()}
    assert methods <= bounds.MCP_METHODS | {"_OTHER"}, methods
    assert {labels.get("gen_ai.tool.name") for labels in operation_series()} - {None} <= tools | {"_OTHER"}
    # The 40 strangers share one series (one method, one error code), however many more come.
    assert [labels for labels in operation_series() if labels["mcp.method.name"] == "_OTHER"] == [
        {"mcp.method.name": "_OTHER", "error.type": "-32601"}
    ]
