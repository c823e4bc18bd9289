"""Who follows which group, so that a change nobody follows is not published: a listening loop registers
before it joins a group, a publisher checks after its commit (why nothing is lost: docs/architecture.md).
Registries: a sorted set per group on ``channels_redis`` scored by when the registration lapses; a count
in this process on the in-memory layer; none elsewhere (every change is published)."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

logger = logging.getLogger("mcptasks.notify")

#: How long a registration lasts unrenewed, in keep-alive periods (this much clock skew is tolerated).
LAPSE_PERIODS = 3
#: The publisher's check gives up after this long and publishes.
CHECK_TIMEOUT_SECONDS = 2.0


class InProcessRegistry:
    """For a layer that delivers only within this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: dict[str, set[str]] = {}

    async def register(self, groups: list[str], member: str, ttl: float) -> None:
        with self._lock:
            for group in groups:
                self._members.setdefault(group, set()).add(member)

    async def unregister(self, groups: list[str], member: str) -> None:
        with self._lock:
            for group in groups:
                members = self._members.get(group, set())
                members.discard(member)
                if not members:
                    self._members.pop(group, None)

    def is_followed(self, group: str) -> bool:
        return group in self._members


class RedisRegistry:
    """Sorted sets in a ``channels_redis`` layer's Redis: registered on the layer's connections, checked with
    a small sync client (publishers are sync code on worker threads)."""

    def __init__(self, layer: Any, host: dict[str, Any]) -> None:
        self.layer = layer
        # A hung Redis must not hold a run's thread: the check then fails and the change is sent.
        self._host = {**dict.fromkeys(("socket_timeout", "socket_connect_timeout"), CHECK_TIMEOUT_SECONDS), **host}
        self._prefix = f"{layer.prefix}:mcptasks.followers:"
        self._client: Any = None
        self._lock = threading.Lock()

    async def register(self, groups: list[str], member: str, ttl: float) -> None:
        now = time.time()
        async with self.layer.connection(0).pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.zremrangebyscore(self._prefix + group, "-inf", now)  # lapsed members (killed processes)
                pipe.zadd(self._prefix + group, {member: now + ttl})
                pipe.expire(self._prefix + group, int(ttl) + 1)
            await pipe.execute()

    async def unregister(self, groups: list[str], member: str) -> None:
        async with self.layer.connection(0).pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.zrem(self._prefix + group, member)
            await pipe.execute()

    def _sync_client(self) -> Any:
        with self._lock:
            if self._client is None:
                import redis

                host = dict(self._host)
                address = host.pop("address", None)
                self._client = redis.Redis.from_url(address, **host) if address else redis.Redis(**host)
            return self._client

    def is_followed(self, group: str) -> bool:
        return bool(self._sync_client().zcount(self._prefix + group, time.time(), "+inf"))


Registry = InProcessRegistry | RedisRegistry
_registries_lock = threading.Lock()
_registries: weakref.WeakKeyDictionary[Any, Registry | None] = weakref.WeakKeyDictionary()


def registry_of(layer: Any) -> Registry | None:
    """The registry of ``layer`` (one per layer), or ``None``."""
    from channels.layers import InMemoryChannelLayer

    with _registries_lock:
        if layer not in _registries:
            # channels_redis's layer (or a subclass), known without importing the optional extra.
            on_redis = any(
                c.__name__ == "RedisChannelLayer" and c.__module__ == "channels_redis.core" for c in type(layer).__mro__
            )
            registry: Registry | None = InProcessRegistry() if isinstance(layer, InMemoryChannelLayer) else None
            if on_redis and layer.hosts and "master_name" not in layer.hosts[0]:  # not behind Sentinel
                registry = RedisRegistry(layer, layer.hosts[0])
            _registries[layer] = registry
        return _registries[layer]


def is_followed(layer: Any, group: str) -> bool:
    """Whether a change to ``group`` may have a listener; when in doubt (no registry, no Redis), yes."""
    registry = registry_of(layer)
    if registry is None:
        return True
    try:
        return registry.is_followed(group)
    except Exception:
        logger.warning("could not look up the followers of %s; publishing", group, exc_info=True)
        return True
