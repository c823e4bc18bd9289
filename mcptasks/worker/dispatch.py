"""Sends a run to a worker from a thread: a Celery message with only the task id. A failed
publish is logged, not raised: the sweeper re-enqueues the task after ``DISPATCH_GRACE_SECONDS``."""

from __future__ import annotations

import logging
from typing import Any

from ..tasks import dispatch
from . import brokers
from .jobs import run_task
from .messages import loop_sender

logger = logging.getLogger("mcptasks.runtime")

PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def enqueue_run(task_id: str, route: dispatch.Route) -> bool:
    brokers.before_first_publish(run_task.app)
    options: dict[str, Any] = {"queue": route.queue, "time_limit": route.kill_after, "countdown": route.countdown}
    try:
        # A short retry: after a broker restart kombu reconnects only when it retries.
        run_task.apply_async(
            (task_id,), retry=True, retry_policy=PUBLISH_RETRY_POLICY, **{k: v for k, v in options.items() if v}
        )
    except Exception:
        logger.warning("could not enqueue task %s; the sweeper will retry", task_id, exc_info=True)
        return False
    return True


def connect() -> None:
    dispatch.install(enqueue_run, loop_sender)
