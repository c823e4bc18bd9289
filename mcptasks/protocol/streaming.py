"""Server-Sent Events: a response that carries notifications before its result.

An inline tool call that asked for progress or log messages runs in a thread;
its notifications and final message flow to the client through an asyncio
queue, so the open stream holds no thread of the server's own. Closing the
stream cancels the call.

An inline run that is answered with plain JSON is a ``Deferred``: the
endpoint runs it on its tool threads, and cancels it when the client hangs up
(see ``inline_runs``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from django.db import connection

from ..errors import INTERNAL_ERROR, ProtocolError
from . import jsonrpc
from .inline_runs import InlineRun, call_cancelled
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
        try:
            async for message in self.messages:
                yield KEEPALIVE if message is None else sse_event(message)
        finally:
            # Closed with the response, so that a hang-up reaches the run at once.
            if isinstance(self.messages, AsyncGenerator):
                await self.messages.aclose()


class Deferred:
    """A reply still to be computed, by blocking work (a tool's inline run)
    that the endpoint runs on its tool threads rather than its web threads.
    ``compute(cancel_event)`` is accepted as one of ``owner``'s inline runs
    (so this raises ``limits.RateLimited`` past their cap); the event is set
    when the client hangs up."""

    def __init__(self, compute: Callable[[threading.Event], Any], owner: str) -> None:
        self.run = InlineRun(owner)
        self._compute = compute

    def compute(self) -> Any:
        """Run the work, unless the client went away before it could start."""
        if not self.run.start():
            raise call_cancelled()
        try:
            return self._compute(self.run.cancel)
        finally:
            self.run.end()

    def abandon(self) -> None:
        """The client hung up: cancel the work, or drop it if not yet started."""
        self.run.abandon()


def threaded_call(
    request_id: jsonrpc.RequestId | None,
    work: Callable[[Notify, threading.Event], dict[str, Any]],
    owner: str,
) -> Stream:
    """Run ``work(notify, cancel_event)`` in a thread, as one of ``owner``'s
    inline runs; stream what it notifies, then its result (or its JSON-RPC
    error). The client closing the stream sets the event, and nothing more
    is sent for the run."""
    run = InlineRun(owner)

    async def messages() -> AsyncIterator[dict[str, Any]]:
        if not run.start():
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def put(item: tuple[str, Any]) -> None:
            if not run.cancel.is_set():  # nobody is reading any more
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def notify(method: str, params: dict[str, Any]) -> None:
            put(("message", {"jsonrpc": "2.0", "method": method, "params": params}))

        def answer() -> dict[str, Any]:
            try:
                return jsonrpc.result(request_id, work(notify, run.cancel))
            except ProtocolError as exc:
                return jsonrpc.error(request_id, exc)
            except BaseException:
                logger.exception("streamed call failed")
                return jsonrpc.error(request_id, ProtocolError(INTERNAL_ERROR, "Internal error"))

        def target() -> None:
            try:
                final = answer()
            finally:
                connection.close()
                run.end()  # before the answer goes out: its caller may call again at once
            put(("message", final))
            put(("end", None))

        threading.Thread(target=target, name="mcptasks-inline-call", daemon=True).start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    return
                yield item
        finally:
            run.cancel.set()  # the client went away, or the stream is done

    stream = Stream(messages())
    # A response dropped before its stream was read (the client hung up at
    # once) never starts the run: its slot is freed with it.
    weakref.finalize(stream, run.abandon)
    return stream
