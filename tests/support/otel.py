"""The OpenTelemetry SDK in the test process: spans to an in-memory exporter,
metrics to an in-memory reader. The global providers can be set once per
process, so this module sets them on first use and tests clear what they
recorded."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class WhileRecording(SimpleSpanProcessor):
    """Keeps spans only while a telemetry test runs: the providers stay set
    for the rest of the session, and other tests' spans would pile up."""

    recording = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.recording:
            super().on_end(span)


@dataclass
class Recorder:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    gate: WhileRecording

    def clear(self) -> None:
        self.spans.clear()
        self.reader.get_metrics_data()  # cumulative: later reads are compared to a baseline

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]

    def points(self, metric: str) -> list[Any]:
        """Every data point of ``metric`` collected now (cumulative)."""
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        out.extend(m.data.data_points)
        return out

    def total(self, metric: str, **attributes: Any) -> float:
        """The sum (counter) or count (histogram) of ``metric`` over points
        whose attributes include ``attributes``."""
        total = 0.0
        for point in self.points(metric):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += getattr(point, "value", None) if hasattr(point, "value") else point.count
        return total


@functools.cache
def recorder() -> Recorder:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    gate = WhileRecording(spans)
    tracer_provider.add_span_processor(gate)
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    # The Prometheus reader fills prometheus_client's registry: what the scrape view serves.
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader, PrometheusMetricReader()]))
    assert trace.get_tracer_provider() is tracer_provider, "another tracer provider was set first"
    return Recorder(spans, reader, gate)


def fresh() -> Iterator[Recorder]:
    rec = recorder()
    rec.clear()
    rec.gate.recording = True
    try:
        yield rec
    finally:
        rec.gate.recording = False
        rec.clear()
