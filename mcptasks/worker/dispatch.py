"""The runtime seam: how a task run gets to a worker.

The domain (``lifecycle``) calls ``enqueue_run`` after commit; only the task id
travels in the message. A publish that fails (broker down) is logged, not
raised: the task row is already durable, and the sweeper re-enqueues any
``working`` task nobody claimed within ``DISPATCH_GRACE_SECONDS``.
"""

from __future__ import annotations

import logging

from ..conf import settings

logger = logging.getLogger("mcptasks.runtime")


_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def enqueue_run(task_id: str) -> bool:
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
