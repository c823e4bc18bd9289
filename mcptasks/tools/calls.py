"""The ``ToolContext`` of a call, built here for every caller of a tool or a
prompt: inline calls of both protocol eras and the worker's task runs. One
builder, so a tool sees the same fields wherever it runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from django.db import connection

from .context import ToolContext
from .owners import user_for_owner


def tool_context(
    *,
    owner: str,
    user: Any = None,
    capabilities: Mapping[str, Any] | None = None,
    answers: Mapping[str, Any] | None = None,
    cancel_event: threading.Event | None = None,
    notify: Callable[[str, dict[str, Any]], None] | None = None,
    progress_token: str | int | None = None,
    log_level: str | None = None,
    task_id: str | None = None,
    on_status: Callable[[str], object] | None = None,
    on_progress: Callable[[str, dict[str, Any]], object] | None = None,
    can_hand_off: bool = False,
    soft_time_limit: float | None = None,
    attempt: int = 1,
) -> ToolContext:
    """The context of one run.

    ``user`` is the caller's Django user where the request knows it; otherwise
    (a task run on a worker) ``ctx.user`` is loaded from ``owner`` the first
    time the tool reads it. Progress and log notifications need somewhere to
    go: without ``notify`` the request's progress token and log level are
    dropped. A run with a ``task_id`` is a task run (``ctx.in_task``).
    """
    return ToolContext(
        owner=owner,
        user=user,
        load_user=off_the_loop(partial(user_for_owner, owner)) if user is None else None,
        capabilities=capabilities,
        answers=answers,
        task_id=task_id,
        cancel_event=cancel_event,
        on_status=on_status,
        on_progress=on_progress,
        on_notify=notify,
        progress_token=progress_token if notify is not None else None,
        log_level=log_level if notify is not None else None,
        in_task=task_id is not None,
        can_hand_off=can_hand_off,
        soft_time_limit=soft_time_limit,
        attempt=attempt,
    )


Result = TypeVar("Result")


def off_the_loop(fn: Callable[..., Result]) -> Callable[..., Result]:
    """``fn``, which does database work, callable from an ``async def`` tool too.

    Django refuses synchronous database work on a thread that runs an event
    loop, and an async tool runs on one (``invoke``). There the call is made on
    a short-lived thread of its own, with its own connection, and waited for:
    the loop is the tool's alone, so nothing else waits with it.
    """

    def call(*args: Any) -> Result:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn(*args)
        outcome: list[Result] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                outcome.append(fn(*args))
            except BaseException as exc:  # raised again in the caller's thread
                failure.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, name="mcptasks-off-loop", daemon=True)
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return outcome[0]

    return call
