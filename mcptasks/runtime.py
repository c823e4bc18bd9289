"""The runtime seam: how a task run gets to a worker.

The domain (``lifecycle``) calls ``enqueue_run`` after commit; only the task id
travels in the message. A publish that fails (broker down) is logged, not
raised: the task row is already durable, and the sweeper re-enqueues any
``working`` task nobody claimed within ``DISPATCH_GRACE_SECONDS``.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from .conf import settings

logger = logging.getLogger("mcptasks.runtime")


_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


#: Set by the ASGI endpoint around a request: runs its changes enqueue are
#: collected here and published once the response is on its way.
_held_runs: ContextVar[list[str] | None] = ContextVar("mcptasks_held_runs", default=None)


def enqueue_run(task_id: str) -> bool:
    held = _held_runs.get()
    if held is not None:
        held.append(task_id)
        return True
    return publish_run(task_id)


def hold_runs() -> list[str]:
    """Collect the runs this context enqueues instead of publishing them, so
    that a client's answer does not wait for the broker. The row is durable
    before the answer leaves; a run lost with the process before
    ``publish_runs`` is re-enqueued by the sweeper (``DISPATCH_GRACE_SECONDS``),
    as is one whose publish fails."""
    held: list[str] = []
    _held_runs.set(held)
    return held


def stop_holding() -> None:
    """Publish this context's later enqueues at once again (a stream that
    outlives its request's answer must not hold them)."""
    _held_runs.set(None)


def publish_runs(task_ids: list[str]) -> None:
    for task_id in task_ids:
        publish_run(task_id)


def publish_run(task_id: str) -> bool:
    from .jobs import run_task

    options = {"queue": settings.CELERY_QUEUE} if settings.CELERY_QUEUE else {}
    try:
        # A short retry: after a broker restart the pooled connection is dead,
        # and kombu reconnects only when it retries.
        run_task.apply_async((task_id,), retry=True, retry_policy=_RETRY_POLICY, **options)
    except Exception:
        logger.warning("could not enqueue task %s; the sweeper will retry", task_id, exc_info=True)
        return False
    return True
