"""Server-Sent Events: a response that carries notifications before its result.

An inline tool call that asked for progress or log messages runs in a thread;
its notifications and final message flow to the client through an asyncio
queue, so the open stream holds no thread of the server's own. Closing the
stream cancels the call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.db import connection

from ..errors import INTERNAL_ERROR, ProtocolError
from . import jsonrpc
from .jsonrpc import encode_json

logger = logging.getLogger("mcptasks.streaming")

Notify = Callable[[str, dict[str, Any]], None]


def sse_event(message: dict[str, Any]) -> bytes:
    return b"data: " + encode_json(message) + b"\n\n"


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


#: An SSE comment: keeps idle connections open through proxies and timeouts.
KEEPALIVE = b":\n\n"


class Stream:
    """JSON-RPC messages to send as an SSE response; ``None`` in the
    iterator sends a keep-alive comment."""

    def __init__(self, messages: AsyncIterator[dict[str, Any] | None]) -> None:
        self.messages = messages

    async def encoded(self) -> AsyncIterator[bytes]:
        async for message in self.messages:
            yield KEEPALIVE if message is None else sse_event(message)


class Deferred:
    """A reply still to be computed, by blocking work (a tool's inline run)
    that the endpoint runs on its tool threads rather than its web threads."""

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute


def threaded_call(
    request_id: jsonrpc.RequestId | None,
    work: Callable[[Notify, threading.Event], dict[str, Any]],
) -> Stream:
    """Run ``work(notify, cancel_event)`` in a thread; stream what it notifies,
    then its result (or its JSON-RPC error)."""

    async def messages() -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        def put(item: tuple[str, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def notify(method: str, params: dict[str, Any]) -> None:
            put(("message", {"jsonrpc": "2.0", "method": method, "params": params}))

        def target() -> None:
            try:
                put(("message", jsonrpc.result(request_id, work(notify, cancel))))
            except ProtocolError as exc:
                put(("message", jsonrpc.error(request_id, exc)))
            except BaseException:
                logger.exception("streamed call failed")
                put(("message", jsonrpc.error(request_id, ProtocolError(INTERNAL_ERROR, "Internal error"))))
            finally:
                put(("end", None))
                connection.close()

        threading.Thread(target=target, name="mcptasks-inline-call", daemon=True).start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    return
                yield item
        finally:
            cancel.set()  # the client went away, or the stream is done

    return Stream(messages())
