"""How a task run gets to a worker: a Celery message with only the task id.

Installed as the domain's sender (``mcptasks.tasks.dispatch``) when the app is
ready. A publish that fails (broker down) is logged, not raised: the task row
is already durable, and the sweeper re-enqueues any ``working`` task nobody
claimed within ``DISPATCH_GRACE_SECONDS``.
"""

from __future__ import annotations

import logging
from typing import Any

from ..tasks import dispatch
from . import brokers
from .jobs import run_task

logger = logging.getLogger("mcptasks.runtime")


PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


#: Whether this process looked at its broker before its first publish.
_broker_checked = False


def _check_broker() -> None:
    """On a Redis broker, publish without building a redis-py client per
    message (``brokers.keep_redis_clients``). Once per process; a race only
    repeats the idempotent check."""
    global _broker_checked
    try:
        conf = run_task.app.conf
        if brokers.uses_redis((conf.broker_url, conf.broker_write_url)):
            brokers.keep_redis_clients()
    except Exception:  # a cost, not a safety, measure: publish as Celery would
        logger.warning("could not check the broker before publishing", exc_info=True)
    _broker_checked = True


def enqueue_run(task_id: str, route: dispatch.Route) -> bool:
    if not _broker_checked:
        _check_broker()
    options: dict[str, Any] = {"queue": route.queue} if route.queue else {}
    if route.kill_after:
        options["time_limit"] = route.kill_after
    if route.countdown:
        options["countdown"] = route.countdown
    try:
        # A short retry: after a broker restart the pooled connection is dead,
        # and kombu reconnects only when it retries.
        run_task.apply_async((task_id,), retry=True, retry_policy=PUBLISH_RETRY_POLICY, **options)
    except Exception:
        logger.warning("could not enqueue task %s; the sweeper will retry", task_id, exc_info=True)
        return False
    return True


def connect() -> None:
    from .messages import loop_sender

    dispatch.install(enqueue_run, loop_sender)
