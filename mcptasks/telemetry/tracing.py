"""mcptasks' tracer, the trace context a task keeps on its row, and the
client's trace context read defensively (:func:`safe_carrier`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

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
    if not settings.TELEMETRY_KEEP_BAGGAGE:
        headers.pop(BAGGAGE, None)
    return headers


# The client's trace context ------------------------------------------------------

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
BAGGAGE = "baggage"

#: W3C Trace Context and Baggage limits: a field past them is ignored as if absent.
TRACEPARENT_CHARS = 55
TRACESTATE_BYTES = 512
TRACESTATE_MEMBERS = 32
BAGGAGE_BYTES = 8192
BAGGAGE_MEMBERS = 180
BAGGAGE_MEMBER_BYTES = 4096
#: A field of some other propagator the site installed.
OTHER_FIELD_CHARS = 512

_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_BAGGAGE_VALUE = r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
_OWS = r"[ \t]*"
_BAGGAGE_MEMBER = re.compile(
    rf"{_TOKEN}{_OWS}={_OWS}{_BAGGAGE_VALUE}"
    rf"(?:{_OWS};{_OWS}{_TOKEN}(?:{_OWS}={_OWS}{_BAGGAGE_VALUE})?)*{_OWS}"
)


def safe_carrier(carrier: Mapping[str, Any], fields: Iterable[str]) -> dict[str, str]:
    """The ``fields`` of ``carrier`` (``params._meta`` or the HTTP headers)
    that are strings within the W3C limits and formats; any other is left
    out, as if the client had not sent it: never an error, and never handed
    to a propagator that would log it as it came."""
    kept: dict[str, str] = {}
    for field in fields:
        value = carrier.get(field)
        if isinstance(value, str) and _field_ok(field, value):
            kept[field] = value
    return kept


def _field_ok(field: str, value: str) -> bool:
    if not value.isascii() or not _PRINTABLE_ASCII.fullmatch(value):
        return False
    if field == TRACEPARENT:
        return len(value) <= TRACEPARENT_CHARS and _TRACEPARENT.fullmatch(value) is not None
    if field == TRACESTATE:
        return len(value) <= TRACESTATE_BYTES and _members_ok(value, TRACESTATE_MEMBERS, _TRACESTATE_MEMBER, keys=True)
    if field == BAGGAGE:
        return len(value) <= BAGGAGE_BYTES and _members_ok(value, BAGGAGE_MEMBERS, _BAGGAGE_MEMBER, keys=False)
    return len(value) <= OTHER_FIELD_CHARS


def _members_ok(value: str, most: int, member: re.Pattern[str], *, keys: bool) -> bool:
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if len(members) > most:
        return False
    seen: set[str] = set()
    for m in members:
        if len(m) > BAGGAGE_MEMBER_BYTES or member.fullmatch(m) is None:
            return False
        if keys:  # a tracestate key appears once
            key = m.split("=", 1)[0]
            if key in seen:
                return False
            seen.add(key)
    return True
