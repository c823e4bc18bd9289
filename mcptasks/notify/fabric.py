"""Committed task changes, pushed through the Channels layer to whoever listens (``subscriptions/listen``,
legacy session streams, blocked ``tasks/result``), in commit order within a process."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Awaitable, Iterable
from typing import Any

from channels.layers import get_channel_layer

from ..conf import settings
from . import followers
from .shutdown import begin_shutdown as begin_shutdown  # worker.runner's import

logger = logging.getLogger("mcptasks.notify")

TOOLS_GROUP = "mcptasks.tools-changed"
PROMPTS_GROUP = "mcptasks.prompts-changed"
MESSAGE_TYPE = "mcptasks.event"
_LIST_METHODS = {TOOLS_GROUP: "notifications/tools/list_changed", PROMPTS_GROUP: "notifications/prompts/list_changed"}
LISTENER_CAPACITY = 100  # messages kept for a stream that is not reading
WAKE_SECONDS = 2.0
_hubs_lock = threading.Lock()
_hubs: dict[asyncio.AbstractEventLoop, _Hub] = {}


def task_group(task_id: str) -> str:
    return f"mcptasks.task.{task_id}"


class _Publisher:
    """Sends to the layer in order from sync code: on the web process's loop (for in-memory layers) or its own."""

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
                loop = self._private_loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcptasks-publisher", daemon=True).start()
            return self._private_loop

    def publish(self, group: str, payload: dict[str, Any]) -> None:
        if get_channel_layer() is not None:
            loop = self._loop()
            loop.call_soon_threadsafe(self._enqueue, loop, group, payload)

    def _enqueue(self, loop: asyncio.AbstractEventLoop, group: str, payload: dict[str, Any]) -> None:
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = asyncio.Queue()
            loop.create_task(self._drain(queue))
        queue.put_nowait((group, payload))

    async def _drain(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        while True:
            group, payload = await queue.get()
            layer = get_channel_layer()  # per message: the site's layer may be replaced (settings change)
            message = {"type": MESSAGE_TYPE, "group": group, **payload}
            hub = _hubs.get(asyncio.get_running_loop())
            if hub is not None and "task_id" in payload and "at" in payload:
                # At once: a later change from elsewhere could overtake the layer's trip (TaskOrder drops the copy).
                hub.dispatch(message)
            if layer is not None:  # publish() enqueues only while a layer is configured
                await _quietly(f"publishing to {group}", layer.group_send(group, message), logging.WARNING)


publisher = _Publisher()


def publish_task(task_id: str, payload: dict[str, Any]) -> None:
    publisher.publish(task_group(task_id), {"task_id": task_id, **payload})


def is_followed(group: str) -> bool:
    """Whether a change committed to ``group`` has a follower (ask after the commit); on a loop, yes unasked."""
    if (layer := get_channel_layer()) is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return followers.is_followed(layer, group)
    return True


def publish_list_changed(group: str) -> None:
    publisher.publish(group, {"list_method": _LIST_METHODS[group]})


class _Hub:
    """Everything one event loop listens to, on one channel of the layer and one receive loop."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.followers = followers.registry_of(layer)
        self.channel: str | None = None
        self.members: dict[str, set[Listener]] = {}
        #: One membership change of a group at a time (join, leave, renew); a lock lives while in use.
        self._guards: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._channel_lock = asyncio.Lock()
        self._receiver: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def join(self, listener: Listener) -> None:
        async with self._channel_lock:
            if self.channel is None:
                self.channel = await self.layer.new_channel("mcptasks.listen.")
        try:
            for group in listener.groups:
                async with self._guards.setdefault(group, asyncio.Lock()):
                    if group not in self.members:
                        # Registered before joining: see ``followers``.
                        await self._follow([group])
                        await self.layer.group_add(group, self.channel)
                        self.members[group] = set()
                    self.members[group].add(listener)
        except BaseException:
            await self.leave(listener)  # the groups it joined
            raise
        if self._receiver is None or self._receiver.done():
            self._receiver = asyncio.create_task(self._receive())
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew())

    async def leave(self, listener: Listener) -> None:
        for group in listener.groups:
            async with self._guards.setdefault(group, asyncio.Lock()):
                members = self.members.get(group, set())
                if members != {listener}:  # not the group's last member, or not one at all
                    members.discard(listener)
                    continue
                del self.members[group]
                await _quietly("group_discard", self.layer.group_discard(group, self.channel))
                if self.followers is not None and self.channel is not None:
                    await _quietly("unregistering a follower", self.followers.unregister([group], self.channel))
        if not self.members:
            if self._renewer is not None:
                self._renewer.cancel()
            receiver = self._receiver
            if receiver is not None and not receiver.done():
                # Wake the receive loop to end by itself, and see it end: the layer allows one receiving loop
                # at a time, and this loop may close once the stream ends.
                try:
                    await self.layer.send(self.channel, {"type": "mcptasks.wake"})
                    await asyncio.wait({receiver}, timeout=WAKE_SECONDS)
                except Exception:
                    logger.debug("could not wake the receive loop", exc_info=True)
                if not receiver.done() and not self.members:
                    receiver.cancel()

    async def _follow(self, groups: list[str]) -> None:
        if self.followers is not None and self.channel is not None and groups:
            await self.followers.register(groups, self.channel, followers.LAPSE_PERIODS * settings.KEEPALIVE_SECONDS)

    async def _receive(self) -> None:
        while self.members:
            try:
                self.dispatch(await self.layer.receive(self.channel))
            except Exception as exc:
                # The layer's client timed out blocking for a message (a socket timeout): nothing arrived yet.
                if "timeout" not in type(exc).__name__.lower():
                    logger.warning("channel layer receive failed", exc_info=True)
                    await asyncio.sleep(1.0)

    def dispatch(self, message: dict[str, Any]) -> None:
        for listener in list(self.members.get(message.get("group", ""), ())):
            listener.deliver(message)

    async def _renew(self) -> None:
        """Re-join every group now and then: the layer expires memberships."""
        while self.members:
            await asyncio.sleep(settings.KEEPALIVE_SECONDS)
            await _quietly("renewing the followers", self._follow(list(self.members)))
            for group in list(self.members):
                async with self._guards.setdefault(group, asyncio.Lock()):
                    if group in self.members:
                        await _quietly("group_add", self.layer.group_add(group, self.channel))


async def _quietly(what: str, action: Awaitable[Any], level: int = logging.DEBUG) -> None:
    """An action whose failure must not stop what follows (a membership change is made good later)."""
    try:
        await action
    except Exception:
        logger.log(level, "%s failed", what, exc_info=True)


class Listener:
    """One stream's subscription to some groups: messages come from its loop's hub and wait in a queue."""

    def __init__(self, groups: Iterable[str]) -> None:
        self.groups = list(dict.fromkeys(groups))
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self._hub: _Hub | None = None
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # stays empty without a layer

    async def __aenter__(self) -> Listener:
        loop = asyncio.get_running_loop()
        publisher.adopt_loop(loop)
        if self.layer is not None:
            with _hubs_lock:
                for gone in [other for other in _hubs if other.is_closed()]:
                    del _hubs[gone]
                hub = _hubs.get(loop)
                if hub is None or hub.layer is not self.layer:
                    hub = _hubs[loop] = _Hub(self.layer)
            await hub.join(self)
            self._hub, self.channel = hub, hub.channel
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._hub is not None:
            hub, self._hub = self._hub, None
            await hub.leave(self)

    def deliver(self, message: dict[str, Any]) -> None:
        if self._queue.qsize() >= LISTENER_CAPACITY:  # a stream that stopped reading
            self._queue.get_nowait()
        self._queue.put_nowait(message)

    async def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or ``None`` after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
