"""The ``ToolContext`` of a call, built here for every caller of a tool or a
prompt: inline calls of both protocol eras and the worker's task runs. One
builder, so a tool sees the same fields wherever it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

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
        load_user=partial(user_for_owner, owner) if user is None else None,
        capabilities=capabilities,
        answers=answers,
        task_id=task_id,
        cancel_event=cancel_event,
        on_status=on_status,
        on_notify=notify,
        progress_token=progress_token if notify is not None else None,
        log_level=log_level if notify is not None else None,
        in_task=task_id is not None,
        can_hand_off=can_hand_off,
        soft_time_limit=soft_time_limit,
        attempt=attempt,
    )
