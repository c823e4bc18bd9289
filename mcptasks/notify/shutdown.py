"""Streams end gracefully when the server stops: an event per event loop, set by :func:`begin_shutdown`."""

from __future__ import annotations

import asyncio

_shutdown_events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}


def shutdown_event() -> asyncio.Event:
    loop = asyncio.get_running_loop()
    event = _shutdown_events.get(loop)
    if event is None:
        event = _shutdown_events[loop] = asyncio.Event()
    return event


def begin_shutdown() -> None:
    """Ask every open stream in this process to close gracefully."""
    for loop, event in list(_shutdown_events.items()):
        if not loop.is_closed():
            loop.call_soon_threadsafe(event.set)
