"""Abuse limits: per-owner throttles, answered with 429 and ``Retry-After``.

Each limit is a setting (``MCPTASKS[...]``); ``None`` turns it off. Throttles count in the process and sync
with the ``THROTTLE_CACHE`` counter every ``THROTTLE_SYNC_MS`` (``throttle_counts``); with 0, every request
is counted in that cache itself. The request size checks are ``request_limits``' (imported here for callers).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.cache import BaseCache, caches
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string
from rest_framework.throttling import SimpleRateThrottle

from .. import threads
from ..conf import settings
from ..errors import RATE_LIMITED, ProtocolError
from .request_limits import RequestTooLarge, check_depth, check_size, storable_id
from .throttle_counts import LocalCounts, Push

__all__ = ["RateLimited", "RequestTooLarge", "check_depth", "check_size", "storable_id"]

logger = logging.getLogger("mcptasks.limits")


class RateLimited(ProtocolError):
    def __init__(self, message: str, retry_after: float) -> None:
        retry_ms = max(1, math.ceil(retry_after * 1000))
        super().__init__(RATE_LIMITED, message, {"retryAfterMs": retry_ms}, http_status=429)
        self.retry_after = retry_after


class _Window:
    """One request against ``limit`` per fixed window of ``seconds`` (polls are the hot path: one counter
    per window, no stored history as DRF's ``SimpleRateThrottle`` keeps)."""

    def __init__(self, scope: str, key: str, limit: int, seconds: float) -> None:
        self.scope, self.limit, self.now = scope, limit, time.time()
        window = int(self.now // seconds)
        self.ends_at, self.timeout = (window + 1) * seconds, math.ceil(seconds) + 1
        self.key = f"mcptasks:throttle:{scope}:{key}:{window}"

    def counted_locally(self) -> bool:
        """Counted in the process's memory, or ``False`` when the shared cache counts each request."""
        counts = local_counts()
        if counts is not None and not counts.admit(self.key, self.limit, self.ends_at, self.timeout):
            raise self.refusal()
        return counts is not None

    def check(self) -> None:
        if self.counted_locally():
            return
        try:
            count = push_counts([(self.key, 1, self.timeout)])[0]
        except Exception as exc:
            return self.uncounted(exc)
        if count > self.limit:
            raise self.refusal()

    async def acheck(self) -> None:
        """:meth:`check` on the event loop, with a redis.asyncio client (see :func:`poll_throttle_on_loop`)."""
        if self.counted_locally():
            return
        try:
            async with _redis_client(on_loop=True).pipeline(transaction=False) as pipe:
                count = int((await _queue(pipe, [(self.key, 1, self.timeout)]).execute())[1])
        except Exception as exc:
            return self.uncounted(exc)
        if count > self.limit:
            raise self.refusal()

    def uncounted(self, exc: Exception) -> None:
        # A shared cache (Redis) that is down must not take the endpoint with it: the request is served.
        logger.warning(
            "throttle cache %r unavailable, %s request not counted: %r", settings.THROTTLE_CACHE, self.scope, exc
        )

    def refusal(self) -> RateLimited:
        return RateLimited(f"Too many {self.scope} requests; retry after the interval", self.ends_at - self.now)


def _rate_window(scope: str, owner: str) -> _Window | None:
    rate = (settings.THROTTLE_RATES or {}).get(scope)
    if not rate:
        return None
    limit, seconds = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
    if limit is None or seconds is None:  # DRF's answer for no rate at all
        raise ValueError(f"{scope}: no rate in {rate!r}")
    return _Window(scope, owner, limit, seconds)


def _poll_window(owner: str, task_id: str, poll_interval_ms: int) -> _Window | None:
    """Polls of one task beyond ``POLL_BURST`` per ``pollIntervalMs`` are refused: honour the task's interval."""
    burst = settings.POLL_BURST
    return _Window("poll", f"{owner}:{task_id}", burst, max(poll_interval_ms, 1) / 1000) if burst else None


def throttle(scope: str, owner: str) -> None:
    """Count one ``scope`` request for ``owner`` (``THROTTLE_RATES``)."""
    if window := _rate_window(scope, owner):
        window.check()


async def athrottle(scope: str, owner: str) -> None:
    """:func:`throttle` from the event loop; a cache's count on a thread (it would block the loop, or raise)."""
    window = _rate_window(scope, owner)
    if window is not None and not window.counted_locally():
        await threads.on_a_thread(window.check)


def throttle_poll(owner: str, task_id: str, poll_interval_ms: int) -> None:
    if window := _poll_window(owner, task_id, poll_interval_ms):
        window.check()


async def athrottle_poll(owner: str, task_id: str, poll_interval_ms: int) -> None:
    """:func:`throttle_poll` on the event loop; only when :func:`poll_throttle_on_loop`."""
    if window := _poll_window(owner, task_id, poll_interval_ms):
        await window.acheck()


def poll_throttle_on_loop() -> bool:
    """Whether :func:`athrottle_poll` can count a poll on the loop (off, counts in memory, or a Redis cache)."""
    return not settings.POLL_BURST or bool(settings.THROTTLE_SYNC_MS) or _redis_client(on_loop=True) is not None


_throttle_caches: dict[str, BaseCache] = {}
_throttle_caches_lock = threading.Lock()


def throttle_cache() -> BaseCache:
    """The ``THROTTLE_CACHE`` backend, one per process: ``caches[alias]`` is context-local, so under ASGI
    each request would build a backend (for Redis, a pool and a connection). Backends are thread-safe."""
    alias = settings.THROTTLE_CACHE
    cache = _throttle_caches.get(alias)
    if cache is None:
        with _throttle_caches_lock:
            cache = _throttle_caches.get(alias)
            if cache is None:
                cache = _throttle_caches[alias] = caches.create_connection(alias)
    return cache


_redis_clients: dict[str, Any] = {}
#: redis.asyncio clients, by event loop (their connections belong to one loop).
_loop_redis_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


def _redis_client(on_loop: bool = False) -> Any:
    """A redis-py client (redis.asyncio's ``on_loop``) for a ``RedisCache`` ``THROTTLE_CACHE``, kept per
    process or loop (Django builds a client per operation), or ``None``: another backend, or on the loop
    a custom pool or parser class, which only has a synchronous form."""
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


def _queue(pipe: Any, batch: Sequence[Push]) -> Any:
    """Each counter's additions on a pipeline: set with its expiry when new, then added to."""
    cache = throttle_cache()
    for key, added, timeout in batch:
        redis_key = cache.make_and_validate_key(key)
        pipe.set(redis_key, 0, ex=timeout, nx=True)
        pipe.incrby(redis_key, added)
    return pipe


def push_counts(batch: Sequence[Push]) -> list[int]:
    """Add each counter's admissions to the throttle cache and return the shared totals: one pipelined round
    trip on Django's Redis backend, the cache's own ``add`` and ``incr`` elsewhere."""
    client = _redis_client()
    if client is not None:
        return [int(total) for total in _queue(client.pipeline(transaction=False), batch).execute()[1::2]]
    cache = throttle_cache()
    totals = []
    for key, added, timeout in batch:
        try:
            totals.append(added if cache.add(key, added, timeout=timeout) else int(cache.incr(key, added)))
        except ValueError:  # expired between add and incr
            cache.add(key, added, timeout=timeout)
            totals.append(added)
    return totals


_local_counts: LocalCounts | None = None
_local_counts_lock = threading.Lock()


def local_counts() -> LocalCounts | None:
    """The process's throttle counters, or ``None`` when ``THROTTLE_SYNC_MS`` is 0."""
    global _local_counts
    interval_ms = settings.THROTTLE_SYNC_MS
    if not interval_ms:
        return None
    counts = _local_counts
    if counts is None:
        with _local_counts_lock:
            counts = _local_counts
            if counts is None:
                describe = f"throttle cache {settings.THROTTLE_CACHE!r}"
                counts = _local_counts = LocalCounts(push_counts, interval_ms / 1000, describe)
    return counts


def _forget_in_child() -> None:
    # Not close(): another thread of the parent may have held its lock at the fork.
    global _local_counts
    _local_counts = None


os.register_at_fork(after_in_child=_forget_in_child)


@receiver(setting_changed)
def _forget_throttle_caches(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "MCPTASKS"):
        _throttle_caches.clear()
        _redis_clients.clear()
        _loop_redis_clients.clear()
        if _local_counts is not None:
            _local_counts.close()
        _forget_in_child()
