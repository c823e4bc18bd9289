"""The OpenTelemetry SDK with in-memory export, for bench/telemetry.py.

Spans go through a batch span processor (as a site would export them, off the
request's path) to the in-memory exporter, which is cleared when it holds
more than ``KEEP`` spans so that a long run's memory stays flat; metrics go
to the in-memory reader, collected every few seconds as a periodic reader
would.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

KEEP = 50_000
COLLECT_SECONDS = 5.0


class BoundedMemoryExporter(InMemorySpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if len(self.get_finished_spans()) > KEEP:
            self.clear()
        return super().export(spans)


def install() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(BoundedMemoryExporter()))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    def collect() -> None:
        while True:
            threading.Event().wait(COLLECT_SECONDS)
            reader.get_metrics_data()

    threading.Thread(target=collect, name="bench-metric-reader", daemon=True).start()
