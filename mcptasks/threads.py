"""The endpoint's fixed thread pools: one for database work, one for tools
that run inline. Shared by the view and the streams that outlive it, and
the one way the event loop awaits a step that cannot run on it
(:func:`on_a_thread`: the ORM, authentication, site receivers)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import close_old_connections

from .conf import settings

T = TypeVar("T")

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


async def on_a_thread(work: Callable[[], T]) -> T:
    """``work``, awaited from the event loop on one of :func:`worker_threads`,
    with the caller's context, and Django's connection upkeep around it as
    for a request."""
    context = contextvars.copy_context()

    def run() -> T:
        close_old_connections()
        try:
            return context.run(work)
        finally:
            close_old_connections()

    return await asyncio.get_running_loop().run_in_executor(worker_threads(), run)
