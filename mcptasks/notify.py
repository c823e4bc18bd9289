"""The notification fabric: committed task changes, pushed through the Channels
layer to whoever listens (``subscriptions/listen`` streams, legacy session
streams, blocked ``tasks/result`` calls).

Publishing happens after commit, from any process that changes a task (web,
worker, admin, commands). Each message carries the task as it was committed by
that change, so a listener sees every transition, not just the latest state.
Within a process, publishes leave in commit order through a single queue.

Polling never depends on this: a lost notification only costs latency.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Any

from channels.layers import get_channel_layer

logger = logging.getLogger("mcptasks.notify")

TOOLS_GROUP = "mcptasks.tools-changed"
PROMPTS_GROUP = "mcptasks.prompts-changed"
MESSAGE_TYPE = "mcptasks.event"


def task_group(task_id: str) -> str:
    return f"mcptasks.task.{task_id}"


class _Publisher:
    """Sends messages to the channel layer, in order, from sync code.

    Messages go through one asyncio queue per loop: the web process's own loop
    when it has one (so in-memory layers work and connections are reused), or
    a private background loop otherwise (workers, commands).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._home_loop: asyncio.AbstractEventLoop | None = None
        self._private_loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, dict[str, Any]]]] = {}

    def adopt_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called from a listener: this process serves streams on ``loop``."""
        with self._lock:
            if self._home_loop is None or self._home_loop.is_closed():
                self._home_loop = loop

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._home_loop is not None and not self._home_loop.is_closed():
                return self._home_loop
            if self._private_loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcptasks-publisher", daemon=True).start()
                self._private_loop = loop
            return self._private_loop

    def publish(self, group: str, payload: dict[str, Any]) -> None:
        if get_channel_layer() is None:
            return
        loop = self._loop()
        loop.call_soon_threadsafe(self._enqueue, loop, group, payload)

    def _enqueue(self, loop: asyncio.AbstractEventLoop, group: str, payload: dict[str, Any]) -> None:
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = asyncio.Queue()
            loop.create_task(self._drain(queue))
        queue.put_nowait((group, payload))

    async def _drain(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        layer = get_channel_layer()
        while True:
            group, payload = await queue.get()
            try:
                await layer.group_send(group, {"type": MESSAGE_TYPE, **payload})
            except Exception:  # a layer outage must not stop later messages
                logger.warning("could not publish to %s", group, exc_info=True)


publisher = _Publisher()


def publish_task(task_id: str, payload: dict[str, Any]) -> None:
    publisher.publish(task_group(task_id), {"task_id": task_id, **payload})


_LIST_METHODS = {
    TOOLS_GROUP: "notifications/tools/list_changed",
    PROMPTS_GROUP: "notifications/prompts/list_changed",
}


def publish_list_changed(group: str) -> None:
    publisher.publish(group, {"list_method": _LIST_METHODS[group]})


class Listener:
    """A subscription to some groups on the channel layer, for one stream."""

    def __init__(self, groups: Iterable[str]) -> None:
        self.groups = list(dict.fromkeys(groups))
        self.layer = get_channel_layer()
        self.channel: str | None = None

    async def __aenter__(self) -> Listener:
        publisher.adopt_loop(asyncio.get_running_loop())
        if self.layer is not None:
            self.channel = await self.layer.new_channel("mcptasks.listen.")
            await self.refresh()
        return self

    async def refresh(self) -> None:
        """(Re-)join the groups: the layer expires memberships eventually."""
        if self.layer is None or self.channel is None:
            return
        for group in self.groups:
            await self.layer.group_add(group, self.channel)

    async def __aexit__(self, *exc: object) -> None:
        if self.layer is None or self.channel is None:
            return
        for group in self.groups:
            try:
                await self.layer.group_discard(group, self.channel)
            except Exception:
                logger.debug("group_discard failed", exc_info=True)

    async def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or ``None`` after ``timeout`` seconds."""
        if self.layer is None or self.channel is None:
            await asyncio.sleep(timeout)
            return None
        try:
            return await asyncio.wait_for(self.layer.receive(self.channel), timeout)
        except TimeoutError:
            return None
        except Exception as exc:
            # The layer's own client timed out while blocking for a message
            # (redis-py reads with a socket timeout): nothing arrived yet.
            if "timeout" in type(exc).__name__.lower():
                return None
            raise

    async def messages(self, keepalive: float) -> AsyncIterator[dict[str, Any] | None]:
        """Messages as they come; ``None`` after each idle ``keepalive`` period."""
        while True:
            message = await self.receive(keepalive)
            if message is None:
                await self.refresh()
            yield message


# Shutdown: streams end gracefully when the server stops.

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
