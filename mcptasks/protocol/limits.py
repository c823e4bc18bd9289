"""Abuse limits: request size and shape, per-owner throttles and quotas.

Each limit is a setting (``MCPTASKS[...]``); ``None`` turns it off. A request
over a limit gets a JSON-RPC error with the HTTP status that says why: 413 for
a body that is too large, 429 (with ``Retry-After``) for a throttle or quota.

Throttles count in the process and sync with the ``THROTTLE_CACHE`` counter
every ``THROTTLE_SYNC_MS`` (``mcptasks.protocol.throttle_counts``); with 0,
every request is counted in that cache itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.cache import BaseCache, caches
from django.core.signals import setting_changed
from django.dispatch import receiver
from rest_framework.throttling import SimpleRateThrottle

from .. import threads
from ..conf import settings
from ..errors import INVALID_REQUEST, RATE_LIMITED, ProtocolError
from .throttle_counts import LocalCounts, Push

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
        children: Iterable[Any]
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
    storable: no NUL character (Postgres text cannot hold one), no lone
    surrogate (not Unicode) and no number past double range. -32602 otherwise."""
    from ..errors import InvalidParams

    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise InvalidParams(f"{what} hold a number past double range (a JSON number must be finite)") from None
    if _ESCAPED_NUL.search(text):
        raise InvalidParams(f"{what} cannot contain NUL characters")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidParams(f"{what} contain a lone surrogate: not valid Unicode") from None
    if limit is not None and size > limit:
        raise InvalidParams(f"{what} too large (limit {limit} bytes)")


def storable_id(value: str, max_chars: int) -> bool:
    """Whether a caller's id could be a stored one: at most ``max_chars``,
    no NUL and valid Unicode (a lone surrogate is not). The database is not
    asked about one that is not: no stored id is."""
    if len(value) > max_chars or "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class FixedWindowThrottle:
    """At most ``limit`` requests per ``seconds`` for a key, counted in the
    process (:func:`local_counts`), or with ``THROTTLE_SYNC_MS`` 0 by one
    atomic cache ``incr`` per request (polls are the hot path: no stored
    history as DRF's ``SimpleRateThrottle`` keeps). Rates use DRF's syntax."""

    def __init__(self, scope: str, limit: int, seconds: float) -> None:
        self.scope = scope
        self.limit = limit
        self.seconds = seconds

    @classmethod
    def from_rate(cls, scope: str, rate: str) -> FixedWindowThrottle:
        limit, seconds = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
        if limit is None or seconds is None:  # DRF's answer for no rate at all
            raise ValueError(f"{scope}: no rate in {rate!r}")
        return cls(scope, limit, seconds)

    def check(self, key: str) -> None:
        now, window, timeout = _window(self.seconds)
        counts = local_counts()
        if counts is not None:
            ends_at = (window + 1) * self.seconds
            if not counts.admit(_throttle_key(self.scope, key, window), self.limit, ends_at, timeout):
                raise _limited(self.scope, window, self.seconds, now)
            return
        cache = throttle_cache()
        try:
            count = _count(cache, _throttle_key(self.scope, key, window), timeout)
        except Exception as exc:
            # A shared cache (Redis) that is down must not take the endpoint
            # with it: the request is served uncounted.
            logger.warning(
                "throttle cache %r unavailable, %s request not counted: %r", settings.THROTTLE_CACHE, self.scope, exc
            )
            return
        if count > self.limit:
            raise _limited(self.scope, window, self.seconds, now)


def _window(seconds: float) -> tuple[float, int, int]:
    """Now, the fixed window it falls in, and the counter's expiry (seconds)."""
    now = time.time()
    return now, int(now // seconds), math.ceil(seconds) + 1


def _count(cache: BaseCache, key: str, timeout: int, added: int = 1) -> int:
    """Add ``added`` to the window's counter and return it (the first hit
    sets it with its expiry). On Django's Redis backend: one round trip, with
    a client kept per process. Elsewhere: the cache's own ``add`` and ``incr``."""
    client = _redis_client(cache)
    if client is not None:
        pipe = client.pipeline(transaction=False)
        redis_key = cache.make_and_validate_key(key)
        pipe.set(redis_key, 0, ex=timeout, nx=True)
        pipe.incrby(redis_key, added)
        return int(pipe.execute()[1])
    if cache.add(key, added, timeout=timeout):
        return added
    try:
        return int(cache.incr(key, added))
    except ValueError:  # expired between add and incr
        cache.add(key, added, timeout=timeout)
        return added


def _redis_config(alias: str) -> tuple[str, dict[str, Any]] | None:
    """The write server's URL and the pool options of a ``RedisCache`` alias,
    from its public configuration (``CACHES``) as Django's own client reads
    it; ``None`` for another backend."""
    from django.conf import settings as django_settings

    config = django_settings.CACHES.get(alias) or {}
    if config.get("BACKEND") != "django.core.cache.backends.redis.RedisCache":
        return None
    location = config.get("LOCATION")
    servers = re.split("[;,]", location) if isinstance(location, str) else list(location or [])
    if not servers:
        return None
    options = {k: v for k, v in (config.get("OPTIONS") or {}).items() if k != "serializer"}
    return servers[0], options  # the first server takes writes


_redis_clients: dict[str, Any] = {}


def _redis_client(cache: BaseCache) -> Any:
    """A redis-py client for the throttle cache, kept per process, or ``None``
    for a backend other than Django's ``RedisCache``. Django builds a client
    object per operation (for redis-py, a few hundred dict entries each time)."""
    from django.core.cache.backends.redis import RedisCache

    if not isinstance(cache, RedisCache):
        return None
    alias = settings.THROTTLE_CACHE
    client = _redis_clients.get(alias)
    if client is None:
        import redis
        from django.utils.module_loading import import_string

        found = _redis_config(alias)
        if found is None:
            return None
        url, options = found
        pool_class = options.pop("pool_class", None) or redis.ConnectionPool
        if isinstance(options.get("parser_class"), str):
            options["parser_class"] = import_string(options["parser_class"])
        pool = (import_string(pool_class) if isinstance(pool_class, str) else pool_class).from_url(url, **options)
        client = _redis_clients[alias] = redis.Redis(connection_pool=pool)
    return client


#: redis.asyncio clients, by event loop (their connections belong to one loop).
_async_redis_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()


def _async_redis_client() -> Any:
    """A redis.asyncio client for a Redis ``THROTTLE_CACHE`` on the running
    loop, or ``None`` (another backend, or a custom pool or parser class that
    only has a synchronous form)."""
    alias = settings.THROTTLE_CACHE
    per_loop = _async_redis_clients.setdefault(asyncio.get_running_loop(), {})
    if alias in per_loop:
        return per_loop[alias]
    client = None
    found = _redis_config(alias)
    if found is not None and "pool_class" not in found[1] and "parser_class" not in found[1]:
        from redis import asyncio as aioredis

        client = aioredis.Redis(connection_pool=aioredis.ConnectionPool.from_url(found[0], **found[1]))
    per_loop[alias] = client
    return client


def poll_throttle_on_loop() -> bool:
    """Whether :func:`athrottle_poll` can count a poll on the event loop (no
    poll throttle, counts kept in the process, or a Redis throttle cache)."""
    return not settings.POLL_BURST or bool(settings.THROTTLE_SYNC_MS) or _async_redis_client() is not None


async def athrottle_poll(owner: str, task_id: str, poll_interval_ms: int) -> None:
    """:func:`throttle_poll` on the event loop, with the same key, window and
    answer; only when :func:`poll_throttle_on_loop`."""
    burst = settings.POLL_BURST
    if not burst:
        return
    seconds = max(poll_interval_ms, 1) / 1000
    now, window, timeout = _window(seconds)
    counts = local_counts()
    if counts is not None:  # memory only: nothing to await
        key = _throttle_key("poll", f"{owner}:{task_id}", window)
        if not counts.admit(key, burst, (window + 1) * seconds, timeout):
            raise _limited("poll", window, seconds, now)
        return
    cache = throttle_cache()
    redis_key = cache.make_and_validate_key(_throttle_key("poll", f"{owner}:{task_id}", window))
    try:
        async with _async_redis_client().pipeline(transaction=False) as pipe:
            pipe.set(redis_key, 0, ex=timeout, nx=True)
            pipe.incr(redis_key)
            count = int((await pipe.execute())[1])
    except Exception as exc:
        logger.warning("throttle cache %r unavailable, poll request not counted: %r", settings.THROTTLE_CACHE, exc)
        return
    if count > burst:
        raise _limited("poll", window, seconds, now)


def _throttle_key(scope: str, key: str, window: int) -> str:
    return f"mcptasks:throttle:{scope}:{key}:{window}"


def _limited(scope: str, window: int, seconds: float, now: float) -> RateLimited:
    return RateLimited(f"Too many {scope} requests; retry after the interval", (window + 1) * seconds - now)


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


_local_counts: LocalCounts | None = None
_local_counts_lock = threading.Lock()


def local_counts() -> LocalCounts | None:
    """The process's throttle counters, or ``None`` when ``THROTTLE_SYNC_MS``
    is 0 (every request counted in the shared cache)."""
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


def push_counts(batch: Sequence[Push]) -> list[int]:
    """Add each counter's admissions to the throttle cache and return the
    shared totals: one pipelined round trip on Django's Redis backend, the
    cache's own ``add`` and ``incr`` elsewhere."""
    cache = throttle_cache()
    client = _redis_client(cache)
    if client is not None:
        pipe = client.pipeline(transaction=False)
        for key, added, timeout in batch:
            redis_key = cache.make_and_validate_key(key)
            pipe.set(redis_key, 0, ex=timeout, nx=True)
            pipe.incrby(redis_key, added)
        return [int(total) for total in pipe.execute()[1::2]]
    return [_count(cache, key, timeout, added) for key, added, timeout in batch]


def forget_local_counts() -> None:
    """Drop the process's counters (the settings changed)."""
    global _local_counts
    if _local_counts is not None:
        _local_counts.close()
    _local_counts = None


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
        _async_redis_clients.clear()
        forget_local_counts()


def throttle(scope: str, owner: str) -> None:
    """Count one ``scope`` request for ``owner`` (``THROTTLE_RATES``)."""
    rate = (settings.THROTTLE_RATES or {}).get(scope)
    if rate:
        FixedWindowThrottle.from_rate(scope, rate).check(owner)


async def athrottle(scope: str, owner: str) -> None:
    """:func:`throttle` from the event loop: counted there in the process's
    memory, or its cache call on a thread (a database or Redis cache's call
    would block the loop, or raise there)."""
    rate = (settings.THROTTLE_RATES or {}).get(scope)
    if not rate:
        return
    window = FixedWindowThrottle.from_rate(scope, rate)
    if local_counts() is not None:
        window.check(owner)
    else:
        await threads.on_a_thread(lambda: window.check(owner))


def throttle_poll(owner: str, task_id: str, poll_interval_ms: int) -> None:
    """Polls of one task beyond ``POLL_BURST`` per ``pollIntervalMs`` window
    are refused: a client is asked to honour the interval the task gives."""
    burst = settings.POLL_BURST
    if burst:
        FixedWindowThrottle("poll", burst, max(poll_interval_ms, 1) / 1000).check(f"{owner}:{task_id}")


#: Inline runs in flight in this process, by owner (``MAX_INLINE_RUNS_PER_OWNER``).
_inline_runs: dict[str, int] = {}
_inline_runs_lock = threading.Lock()

#: What a caller refused for too many inline runs is told to wait: runs end
#: when their tool returns or notices a cancel, which the server cannot date.
INLINE_RUN_RETRY_SECONDS = 1.0


def claim_inline_run(owner: str) -> None:
    """Count one inline run (a tool or prompt run within its request) for
    ``owner`` until :func:`release_inline_run`. Past ``MAX_INLINE_RUNS_PER_OWNER``
    runs of this web process at once, -31000 with HTTP 429: the inline pool is
    shared, and one caller must not fill it."""
    cap = settings.MAX_INLINE_RUNS_PER_OWNER
    with _inline_runs_lock:
        running = _inline_runs.get(owner, 0)
        if cap is not None and running >= cap:
            raise RateLimited(
                f"Too many inline runs at once (limit {cap}); retry when one has ended", INLINE_RUN_RETRY_SECONDS
            )
        _inline_runs[owner] = running + 1


def release_inline_run(owner: str) -> None:
    """One inline run of ``owner`` has ended (or will never start)."""
    with _inline_runs_lock:
        running = _inline_runs.get(owner, 0) - 1
        if running > 0:
            _inline_runs[owner] = running
        else:
            _inline_runs.pop(owner, None)


def inline_runs(owner: str) -> int:
    """Inline runs of ``owner`` in flight in this process."""
    with _inline_runs_lock:
        return _inline_runs.get(owner, 0)
