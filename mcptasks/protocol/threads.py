"""The endpoint's fixed thread pools: one for database work, one for tools
that run inline. Shared by the view and the streams that outlive it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from ..conf import settings

_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str, size: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"mcptasks-{name}")
        return _pools[name]


def worker_threads() -> ThreadPoolExecutor:
    """A fixed pool of threads for the endpoint's database work.

    Django would otherwise run each request's sync code on a fresh thread
    under ASGI, so a persistent connection would never be reused; a fixed
    pool keeps one connection per thread, checked as Django checks them.
    """
    return _pool("web", settings.WEB_THREADS)


def tool_threads() -> ThreadPoolExecutor:
    """Threads for tools that run inline, so that slow inline calls never
    hold the web threads that polls need."""
    return _pool("tools", settings.INLINE_TOOL_THREADS)
