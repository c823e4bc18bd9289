"""Abuse limits: request size and shape, per-owner throttles and quotas.

Each limit is a setting (``MCPTASKS[...]``); ``None`` turns it off. A request
over a limit gets a JSON-RPC error with the HTTP status that says why: 413 for
a body that is too large, 429 (with ``Retry-After``) for a throttle or quota.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from typing import Any

from django.core.cache import BaseCache, caches
from django.core.signals import setting_changed
from django.dispatch import receiver
from rest_framework.throttling import SimpleRateThrottle

from ..conf import settings
from ..errors import INVALID_REQUEST, RATE_LIMITED, ProtocolError

logger = logging.getLogger("mcptasks.limits")


class RequestTooLarge(ProtocolError):
    def __init__(self, limit: int) -> None:
        super().__init__(INVALID_REQUEST, f"Request body too large (limit {limit} bytes)", http_status=413)


class RateLimited(ProtocolError):
    def __init__(self, message: str, retry_after: float) -> None:
        retry_ms = max(1, math.ceil(retry_after * 1000))
        super().__init__(RATE_LIMITED, message, {"retryAfterMs": retry_ms}, http_status=429)
        self.retry_after = retry_after


def check_depth(value: Any, limit: int | None = None) -> None:
    """Refuse JSON nested deeper than ``MAX_JSON_DEPTH`` (iteratively: a deep
    document must not exhaust the stack while being checked)."""
    limit = limit if limit is not None else settings.MAX_JSON_DEPTH
    if limit is None:
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise ProtocolError(INVALID_REQUEST, f"Invalid Request: JSON nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


#: ``\u0000`` as JSON writes a NUL (an odd run of backslashes before ``u0000``).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_size(value: Any, limit: int | None, what: str) -> None:
    """``value`` (arguments, answers) must fit ``limit`` once encoded, and be
    storable: no NUL character (Postgres text cannot hold one) and no lone
    surrogate (not Unicode). -32602 otherwise."""
    from ..errors import InvalidParams

    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if _ESCAPED_NUL.search(text):
        raise InvalidParams(f"{what} cannot contain NUL characters")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidParams(f"{what} contain a lone surrogate: not valid Unicode") from None
    if limit is not None and size > limit:
        raise InvalidParams(f"{what} too large (limit {limit} bytes)")


class FixedWindowThrottle:
    """At most ``limit`` requests per ``seconds`` for a key, counted with one
    atomic cache ``incr`` per request (polls are the hot path: no stored
    history as DRF's ``SimpleRateThrottle`` keeps). Rates use DRF's syntax."""

    def __init__(self, scope: str, limit: int, seconds: float) -> None:
        self.scope = scope
        self.limit = limit
        self.seconds = seconds

    @classmethod
    def from_rate(cls, scope: str, rate: str) -> FixedWindowThrottle:
        limit, seconds = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
        return cls(scope, limit, seconds)

    def check(self, key: str) -> None:
        cache = throttle_cache()
        now = time.time()
        window = int(now // self.seconds)
        cache_key = f"mcptasks:throttle:{self.scope}:{key}:{window}"
        timeout = math.ceil(self.seconds) + 1
        try:
            count = _count(cache, cache_key, timeout)
        except Exception as exc:
            # A shared cache (Redis) that is down must not take the endpoint
            # with it: the request is served uncounted.
            logger.warning(
                "throttle cache %r unavailable, %s request not counted: %r", settings.THROTTLE_CACHE, self.scope, exc
            )
            return
        if count > self.limit:
            raise RateLimited(
                f"Too many {self.scope} requests; retry after the interval",
                (window + 1) * self.seconds - now,
            )


def _count(cache: BaseCache, key: str, timeout: int) -> int:
    """Add one to the window's counter and return it (the first hit sets it
    to 1 with its expiry). On Django's Redis backend: one round trip, with a
    client kept per cache object. Elsewhere: the cache's own ``add`` and
    ``incr``."""
    client = _redis_client(cache)
    if client is not None:
        pipe = client.pipeline(transaction=False)
        redis_key = cache.make_and_validate_key(key)
        pipe.set(redis_key, 0, ex=timeout, nx=True)
        pipe.incr(redis_key)
        return int(pipe.execute()[1])
    if cache.add(key, 1, timeout=timeout):
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=timeout)
        return 1


def _redis_client(cache: BaseCache) -> Any:
    """A redis-py client on the cache's own pool, or ``None`` for a backend
    other than Django's ``RedisCache``. Django builds a client object per
    operation (for redis-py, a few hundred dict entries each time)."""
    from django.core.cache.backends.redis import RedisCache

    if not isinstance(cache, RedisCache):
        return None
    client = cache.__dict__.get("_mcptasks_client")
    if client is None:
        client = cache.__dict__["_mcptasks_client"] = cache._cache.get_client(write=True)
    return client


_throttle_caches: dict[str, BaseCache] = {}
_throttle_caches_lock = threading.Lock()


def throttle_cache() -> BaseCache:
    """The ``THROTTLE_CACHE`` backend, one object per process.

    ``caches[alias]`` is context-local: under ASGI every request runs in a
    context of its own and would build a new backend, and for Redis a new
    connection pool and a new connection, on every poll. Cache backends are
    thread-safe (redis-py's pool also survives a fork), so one is shared.
    """
    alias = settings.THROTTLE_CACHE
    cache = _throttle_caches.get(alias)
    if cache is None:
        with _throttle_caches_lock:
            cache = _throttle_caches.get(alias)
            if cache is None:
                cache = _throttle_caches[alias] = caches.create_connection(alias)
    return cache


@receiver(setting_changed)
def _forget_throttle_caches(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "MCPTASKS"):
        _throttle_caches.clear()


def throttle(scope: str, owner: str) -> None:
    """Count one ``scope`` request for ``owner`` (``THROTTLE_RATES``)."""
    rate = (settings.THROTTLE_RATES or {}).get(scope)
    if rate:
        FixedWindowThrottle.from_rate(scope, rate).check(owner)


def throttle_poll(owner: str, task_id: str, poll_interval_ms: int) -> None:
    """Polls of one task beyond ``POLL_BURST`` per ``pollIntervalMs`` window
    are refused: a client is asked to honour the interval the task gives."""
    burst = settings.POLL_BURST
    if burst:
        FixedWindowThrottle("poll", burst, max(poll_interval_ms, 1) / 1000).check(f"{owner}:{task_id}")
