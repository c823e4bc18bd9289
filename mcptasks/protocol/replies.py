"""What the endpoint answers, before it is HTTP.

Handlers of both eras describe their answer as a :class:`WireReply` (one
JSON-RPC message, an SSE stream, or no body, with its HTTP status and
headers); the web layer renders it. The one error path of the endpoint,
:func:`failsafe`, lives here too, so that an outage or a bug gets the same
JSON-RPC error in either era.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import DatabaseError

from ..errors import INTERNAL_ERROR, ProtocolError
from ..tasks.sql import NotOnLoop
from . import jsonrpc
from .limits import RateLimited
from .streaming import Stream

logger = logging.getLogger("mcptasks.views")  # the endpoint's logger, as operators configure it

T = TypeVar("T")

STORE_UNAVAILABLE = "Internal error: the task store is unavailable; retry later"


@dataclass(frozen=True)
class WireReply:
    """One HTTP answer: ``body`` (a JSON-RPC message), or ``stream`` (an SSE
    stream), or neither (e.g. 202 Accepted)."""

    status: int = 200
    body: dict[str, Any] | None = None
    stream: Stream | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def message_reply(body: dict[str, Any], status: int = 200, headers: Mapping[str, str] | None = None) -> WireReply:
    return WireReply(status=status, body=body, headers=dict(headers or {}))


def empty_reply(status: int) -> WireReply:
    return WireReply(status=status)


def stream_reply(stream: Stream) -> WireReply:
    return WireReply(stream=stream)


def result_reply(request_id: jsonrpc.RequestId | None, value: dict[str, Any] | Stream) -> WireReply:
    """A handler's result: an SSE stream as it is, a value as its JSON-RPC result."""
    if isinstance(value, Stream):
        return stream_reply(value)
    return message_reply(jsonrpc.result(request_id, value))


def error_reply(exc: ProtocolError, request_id: Any = None, status: int = 400) -> WireReply:
    """``exc`` as a JSON-RPC error, with the headers it carries (a 403
    insufficient_scope carries its challenge); a rate limit, in either era,
    also says when to come back (``Retry-After``)."""
    headers = dict(getattr(exc, "headers", None) or {})
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return message_reply(jsonrpc.error(request_id, exc), status=status, headers=headers)


def failsafe(serve: Callable[[], T], request_id: Any = None) -> T | WireReply:
    """Run ``serve``; an outage or a bug still gets a JSON-RPC error (503 or
    500), not an HTML page. The one error path around both eras' handlers."""
    try:
        return serve()
    except Exception as exc:
        return unexpected_error_reply(exc, request_id)


def unexpected_error_reply(exc: Exception, request_id: Any = None) -> WireReply:
    """The answer to an error no handler answers, wherever it was served
    (a thread, through :func:`failsafe`, or the event loop), logged once."""
    if isinstance(exc, DatabaseError | NotOnLoop):
        # The database went away around the request (a restart): a clean
        # JSON-RPC error; the next request reconnects.
        logger.warning("database unavailable", exc_info=exc)
        return error_reply(ProtocolError(INTERNAL_ERROR, STORE_UNAVAILABLE), request_id, status=503)
    logger.error("unexpected error serving /mcp", exc_info=exc)
    return error_reply(ProtocolError(INTERNAL_ERROR, "Internal error"), request_id, status=500)
