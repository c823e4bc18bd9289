"""OpenTelemetry traces and metrics, through the API only.

mcptasks never imports the OpenTelemetry SDK: without one the API is a no-op,
and with one (the site's choice, configured by the site) the spans and
metrics described in docs/observability.md are exported wherever the site
points them.

``MCPTASKS["TELEMETRY"]`` picks the mode:

- ``"native"``: a span per request and per run, and the metrics;
- ``"propagation"``: no spans or metrics of ours, but the client's trace
  context is kept on the task and made current around its runs, so the
  site's own instrumentation continues the client's trace;
- ``"off"``: nothing at all; each hook is one settings lookup.

The hooks live in ``requests`` (the endpoint), ``runs`` (the worker) and
``metrics`` (task counters, histograms and gauges).
"""

from __future__ import annotations

from ..conf import settings

OFF = "off"
PROPAGATION = "propagation"
NATIVE = "native"
MODES = (OFF, PROPAGATION, NATIVE)


def mode() -> str:
    return str(settings.TELEMETRY)


def propagating() -> bool:
    """Trace context is carried (``propagation`` or ``native``)."""
    return bool(settings.TELEMETRY != OFF)


def native() -> bool:
    return bool(settings.TELEMETRY == NATIVE)
