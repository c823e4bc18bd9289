"""Waiting for a task to reach a terminal status, without holding a lock."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..models import TERMINAL_STATUSES, Task


def wait_for_terminal(
    task_id: str, timeout: float, *, interval: float = 0.02, stop: Callable[[], bool] | None = None
) -> Task | None:
    """The task once terminal, or ``None`` if ``timeout`` passes first (or
    ``stop()`` turns true, checked at every look)."""
    deadline = time.monotonic() + timeout
    while True:
        task = Task.objects.filter(pk=task_id).first()
        if task is None or task.status in TERMINAL_STATUSES:
            return task
        if time.monotonic() >= deadline or (stop is not None and stop()):
            return None
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(interval * 1.5, 0.1)
