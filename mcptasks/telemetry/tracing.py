"""mcptasks' tracer, and the trace context a task keeps on its row."""

from __future__ import annotations

import functools

from opentelemetry import propagate, trace

from ..conf import package_version, settings
from . import OFF
from .names import INSTRUMENTATION_NAME


@functools.cache
def tracer() -> trace.Tracer:
    """From the global provider (a proxy until the site sets one, so the
    order of setup does not matter)."""
    return trace.get_tracer(INSTRUMENTATION_NAME, package_version())


def sdk_installed() -> bool:
    """Whether the site set a tracer provider. Until it does, ``native``
    costs what ``propagation`` costs: the API would only make no-op spans,
    and no-op spans would drop the client's context instead of carrying it."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``,
    ``tracestate``), for a new task's row; empty when there is none."""
    if settings.TELEMETRY == OFF:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers
