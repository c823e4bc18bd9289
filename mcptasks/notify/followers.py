"""Who follows which group, so that a change nobody follows is not published (docs/architecture.md): a sorted
set per group on ``channels_redis``, the groups in this process on the in-memory layer, none elsewhere."""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from typing import Any

from channels.layers import InMemoryChannelLayer

logger = logging.getLogger("mcptasks.notify")

#: How long a registration lasts unrenewed, in keep-alive periods (this much clock skew is tolerated).
LAPSE_PERIODS = 3
#: channels_redis's layer (a subclass too), known without importing the optional extra.
_REDIS_LAYER = ("channels_redis.core", "RedisChannelLayer")


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
    """Sorted sets in a ``channels_redis`` layer's Redis, checked with a sync client (publishers run on threads)."""

    def __init__(self, layer: Any, host: dict[str, Any]) -> None:
        self.layer, self._host = layer, host
        self._prefix = f"{layer.prefix}:mcptasks.followers:"

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

    @functools.cached_property
    def _client(self) -> Any:  # threads that race may build one each: the spares go after one check
        import redis

        # A hung Redis must not hold a run's thread: the check then fails and the change is sent.
        host = {**dict.fromkeys(("socket_timeout", "socket_connect_timeout"), 2.0), **self._host}
        address = host.pop("address", None)
        return redis.Redis.from_url(address, **host) if address else redis.Redis(**host)

    def is_followed(self, group: str) -> bool:
        return bool(self._client.zcount(self._prefix + group, time.time(), "+inf"))


Registry = InProcessRegistry | RedisRegistry
_registries_lock = threading.Lock()
_registries: weakref.WeakKeyDictionary[Any, Registry | None] = weakref.WeakKeyDictionary()


def registry_of(layer: Any) -> Registry | None:
    """The registry of ``layer`` (one per layer), or ``None``."""
    with _registries_lock:
        if layer not in _registries:
            on_redis = _REDIS_LAYER in {(c.__module__, c.__name__) for c in type(layer).__mro__}
            _registries[layer] = InProcessRegistry() if isinstance(layer, InMemoryChannelLayer) else None
            if on_redis and layer.hosts and "master_name" not in layer.hosts[0]:  # not behind Sentinel
                _registries[layer] = RedisRegistry(layer, layer.hosts[0])
        return _registries[layer]


def is_followed(layer: Any, group: str) -> bool:
    """Whether a change to ``group`` may have a listener; when in doubt (no registry, no Redis), yes."""
    registry = registry_of(layer)
    try:
        return registry is None or registry.is_followed(group)
    except Exception:
        logger.warning("could not look up the followers of %s; publishing", group, exc_info=True)
        return True
