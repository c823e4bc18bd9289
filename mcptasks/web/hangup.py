"""A client hanging up cancels its request (2026-07-28, "Transport-Specific
Cancellation").

Whichever ASGI handler serves the endpoint (``mcp_router``'s, or Django's
for sites that mount ``mcptasks.urls``) cancels the view's coroutine when the
client disconnects. The view's work runs on threads that cannot be stopped
from outside; what this module does is turn that cancellation into what a
thread does notice: the inline run's cancel event. A run that has not started
never starts, and a reply computed for nobody is dropped unsent.

Work that creates a task is not cancelled: a task outlives the connection
that created it, and whatever the thread committed stays committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from django.core.exceptions import RequestAborted

T = TypeVar("T")


async def until_hangup(respond: Awaitable[None], disconnect: Awaitable[None]) -> None:
    """``respond`` while ``disconnect`` listens for the client going away (``mcp_router``'s
    route, as Django's own handler does): a hang-up cancels it, and nothing more is sent."""
    work = asyncio.ensure_future(respond)
    listening = asyncio.ensure_future(disconnect)
    try:
        await asyncio.wait({work, listening}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (listening, work):
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                await task


async def outliving(work: Awaitable[T], orphaned: Callable[[T], None]) -> T:
    """``await work``; if the client hangs up meanwhile, the work still runs
    to its end (threads are not interrupted, and a job the pool has not
    started yet still runs), and its result goes to ``orphaned``."""
    running = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        running.add_done_callback(lambda done: _hand_over(done, orphaned))
        raise


def _hand_over(done: asyncio.Future[T], orphaned: Callable[[T], None]) -> None:
    if not done.cancelled() and done.exception() is None:
        orphaned(done.result())


async def cancelled_by_hangup(work: Awaitable[T], cancel: Callable[[], None]) -> T:
    """``await work`` (an inline run); a hang-up meanwhile calls ``cancel``
    and leaves the run to end on its own, answering nobody."""
    try:
        return await outliving(work, lambda _reply: None)
    except asyncio.CancelledError:
        cancel()
        raise
