"""The ``THROTTLE_CACHE`` backend and its Redis clients, built once per process (or loop) from ``CACHES``."""

from __future__ import annotations

import asyncio
import importlib
import re
import weakref
from typing import Any

from django.conf import settings as django_settings
from django.core.cache import BaseCache, caches
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from ..conf import settings

_throttle_caches: dict[str, BaseCache] = {}
_redis_clients: dict[str, Any] = {}
#: redis.asyncio clients, by event loop (their connections belong to one loop).
_loop_redis_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


def throttle_cache() -> BaseCache:
    """The ``THROTTLE_CACHE`` backend, one per process (``caches[alias]`` builds one per ASGI request)."""
    alias = settings.THROTTLE_CACHE
    cache = _throttle_caches.get(alias)
    if cache is None:  # threads that race build one each, and all keep the first (a backend connects on use)
        cache = _throttle_caches.setdefault(alias, caches.create_connection(alias))
    return cache


def redis_client(on_loop: bool = False) -> Any:
    """A redis-py client (redis.asyncio's ``on_loop``) for a ``RedisCache`` ``THROTTLE_CACHE``, kept per process
    or loop, or ``None``: another backend, or on the loop a custom pool or parser class (sync only)."""
    alias = settings.THROTTLE_CACHE
    kept = _loop_redis_clients.setdefault(asyncio.get_running_loop(), {}) if on_loop else _redis_clients
    if alias in kept:
        return kept[alias]
    config = django_settings.CACHES.get(alias) or {}
    location = config.get("LOCATION")
    servers = re.split("[;,]", location) if isinstance(location, str) else list(location or [])
    options = {k: v for k, v in (config.get("OPTIONS") or {}).items() if k != "serializer"}
    client = None
    custom = on_loop and ("pool_class" in options or "parser_class" in options)
    if config.get("BACKEND") == "django.core.cache.backends.redis.RedisCache" and servers and not custom:
        redis = importlib.import_module("redis.asyncio" if on_loop else "redis")
        for name in ("pool_class", "parser_class"):
            if isinstance(options.get(name), str):
                options[name] = import_string(options[name])
        pool_class = options.pop("pool_class", None) or redis.ConnectionPool
        client = redis.Redis(connection_pool=pool_class.from_url(servers[0], **options))  # the first takes writes
    kept[alias] = client
    return client


@receiver(setting_changed)
def _forget_clients(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "MCPTASKS"):
        _throttle_caches.clear()
        _redis_clients.clear()
        _loop_redis_clients.clear()
