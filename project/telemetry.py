"""The example site's OpenTelemetry SDK: OTLP export when the environment
names an endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``, or the per-signal
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` and ``..._METRICS_ENDPOINT``), and
nothing otherwise.

mcptasks itself speaks only the OpenTelemetry API; which SDK and exporters a
site uses is the site's choice, and this is the example site's. Everything
else comes from the standard environment: ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_METRIC_EXPORT_INTERVAL``, ...

Export never slows a request or a run: spans wait in the batch processor's
bounded queue and leave from its own thread, metrics from the periodic
reader's. What cannot be exported (a full queue, a collector down) is
dropped, counted in ``mcptasks.telemetry.dropped`` and logged once per
process and kind (the SDK itself would log every one).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("mcptasks.telemetry")

_lock = threading.Lock()
_configured = False


def prometheus_wanted() -> bool:
    """``OTEL_METRICS_EXPORTER`` names ``prometheus``: the web process keeps
    its metrics for the ``/metrics`` scrape view."""
    return "prometheus" in os.environ.get("OTEL_METRICS_EXPORTER", "").lower().split(",")


def endpoint_named() -> bool:
    return any(
        os.environ.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    )


def configure() -> bool:
    """Set the global tracer and meter providers once per process, when an
    endpoint is named and ``OTEL_SDK_DISABLED`` is not ``true``. Returns
    whether this call set them."""
    global _configured
    otlp = endpoint_named()
    if not (otlp or prometheus_wanted()) or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    with _lock:
        if _configured:
            return False
        _configured = True
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "mcptasks")})
    readers: list[Any] = []
    if otlp:
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if prometheus_wanted():
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    metrics.set_meter_provider(meter_provider)
    dropped = metrics.get_meter("mcptasks.telemetry").create_counter(
        "mcptasks.telemetry.dropped", unit="{item}", description="Spans or metric batches this process could not export"
    )

    class CountingExporter(SpanExporter):
        """The OTLP exporter, counting what a failed export loses."""

        def __init__(self, inner: SpanExporter) -> None:
            self.inner = inner
            self.warned = False

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            try:
                result = self.inner.export(spans)
            except Exception:
                result = SpanExportResult.FAILURE
            if result is not SpanExportResult.SUCCESS:
                dropped.add(len(spans), {"error.type": "export_failed", "signal": "spans"})
                if not self.warned:
                    self.warned = True
                    logger.warning(
                        "telemetry: the collector did not take %d spans; drops are counted from now on", len(spans)
                    )
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self.inner.force_flush(timeout_millis)

    if not otlp:
        _log_drops_once(dropped)
        return True  # metrics for the scrape view only
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(CountingExporter(OTLPSpanExporter())))
    trace.set_tracer_provider(tracer_provider)
    _log_drops_once(dropped)  # after the imports above: their loggers exist now
    return True


def _log_drops_once(dropped: Any) -> None:
    """The SDK and the exporters log every drop and every failed export:
    let the first of each kind through, per process, and count the drops.
    A kind is a logger and its message's format string, never the formatted
    message: values in it may come from a caller, and they would make each
    message a kind of its own and fill the set."""

    class OncePerKind(logging.Filter):
        seen: set[tuple[str, str]] = set()

        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno < logging.WARNING:
                return True
            template = str(record.msg)
            if template.startswith("Queue full"):
                dropped.add(1, {"error.type": "queue_full", "signal": "spans"})
            elif template.startswith("Failed to export metrics"):
                dropped.add(1, {"error.type": "export_failed", "signal": "metrics"})
            kind = (record.name, template)
            if kind in OncePerKind.seen:
                return False
            if len(OncePerKind.seen) < 1024:  # format strings are the code's: a bound never reached
                OncePerKind.seen.add(kind)
            return True

    once = OncePerKind()
    for name, found in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("opentelemetry") and isinstance(found, logging.Logger):
            found.addFilter(once)
