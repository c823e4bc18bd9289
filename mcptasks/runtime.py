"""The runtime seam: how a task run gets to a worker.

The domain (``lifecycle``) calls ``enqueue_run`` after commit; only the task id
travels in the message. A publish that fails (broker down) is logged, not
raised: the task row is already durable, and the sweeper re-enqueues any
``working`` task nobody claimed within ``DISPATCH_GRACE_SECONDS``.
"""

from __future__ import annotations

import logging

from .conf import settings

logger = logging.getLogger("mcptasks.runtime")


def enqueue_run(task_id: str) -> bool:
    from .jobs import run_task

    options = {"queue": settings.CELERY_QUEUE} if settings.CELERY_QUEUE else {}
    try:
        run_task.apply_async((task_id,), retry=False, **options)
    except Exception:
        logger.warning("could not enqueue task %s; the sweeper will retry", task_id, exc_info=True)
        return False
    return True
