"""Site code that may be ``async def``, called from a thread: a tool, a
prompt, a resource (or template) and a prompt's completions. Each is run to
its value on an event loop of its own (the thread runs none), so that the
caller, a handler of either era or a task run, gets the value itself."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any


def awaited(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable (an ``async``
    site function's result), run to its end on a loop of its own."""
    if inspect.isawaitable(value):
        return asyncio.run(_await(value))
    return value


async def _await(value: Awaitable[Any]) -> Any:
    return await value


def synchronous(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` as the protocol layer calls it: an ``async`` one's result
    awaited, so that a prompt, resource or completion gives its value. A
    plain function is kept as it is."""
    # An instance's ``async def __call__`` makes it an async function too.
    if not (inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)):
        return func

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        return awaited(func(*args, **kwargs))

    return call
