"""Per-owner throttles, refused with 429: counted in the process and synced every ``THROTTLE_SYNC_MS``
(``throttle_counts``), or with 0 each in ``THROTTLE_CACHE``. ``request_limits``' checks are re-exported."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from rest_framework.throttling import SimpleRateThrottle

from .. import threads
from ..conf import settings
from ..errors import RATE_LIMITED, ProtocolError
from .request_limits import RequestTooLarge, check_depth, check_size, storable_id
from .throttle_cache import redis_client, throttle_cache
from .throttle_counts import LocalCounts, Push

__all__ = ["RateLimited", "RequestTooLarge", "check_depth", "check_size", "storable_id"]

logger = logging.getLogger("mcptasks.limits")
#: The process's counters, by ``THROTTLE_CACHE`` (a dict for its atomic ``setdefault``).
_local_counts: dict[str, LocalCounts] = {}
os.register_at_fork(after_in_child=_local_counts.clear)  # not close(): a parent's thread may have held its lock


class RateLimited(ProtocolError):
    def __init__(self, message: str, retry_after: float) -> None:
        retry_ms = max(1, math.ceil(retry_after * 1000))
        super().__init__(RATE_LIMITED, message, {"retryAfterMs": retry_ms}, http_status=429)
        self.retry_after = retry_after


class _Window:
    """One request against ``limit`` per fixed window of ``seconds``: one counter, no history as DRF keeps."""

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
        throttle_cache()  # a misnamed THROTTLE_CACHE raises here, not as a cache outage
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
        throttle_cache()  # as in check()
        try:
            async with redis_client(on_loop=True).pipeline(transaction=False) as pipe:
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
    # DRF's syntax; (None, None) is its answer for no rate only.
    return _Window(scope, owner, *SimpleRateThrottle.parse_rate(None, rate))  # type: ignore[arg-type]


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
    return not settings.POLL_BURST or bool(settings.THROTTLE_SYNC_MS) or redis_client(on_loop=True) is not None


def _queue(pipe: Any, batch: Sequence[Push]) -> Any:
    """Each counter's additions on a pipeline: set with its expiry when new, then added to."""
    cache = throttle_cache()
    for key, added, timeout in batch:
        redis_key = cache.make_and_validate_key(key)
        pipe.set(redis_key, 0, ex=timeout, nx=True)
        pipe.incrby(redis_key, added)
    return pipe


def push_counts(batch: Sequence[Push]) -> list[int]:
    """Add each counter's admissions to the throttle cache and return the totals (one round trip on Redis)."""
    client = redis_client()
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


def local_counts() -> LocalCounts | None:
    """The process's throttle counters, or ``None`` when ``THROTTLE_SYNC_MS`` is 0."""
    interval_ms, alias = settings.THROTTLE_SYNC_MS, settings.THROTTLE_CACHE
    if not interval_ms:
        return None
    counts = _local_counts.get(alias)
    if counts is None:  # threads that race build one each, and all keep the first (it counts nothing yet)
        built = LocalCounts(push_counts, interval_ms / 1000, f"throttle cache {alias!r}")
        counts = _local_counts.setdefault(alias, built)
    return counts


@receiver(setting_changed)
def _forget_throttle_counts(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "MCPTASKS"):
        while _local_counts:
            _local_counts.popitem()[1].close()
