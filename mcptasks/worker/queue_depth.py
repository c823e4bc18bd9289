"""The run queue's depth, as a gauge, where the broker can tell it.

A passive ``queue_declare`` answers with the queue's message count on AMQP
(RabbitMQ) and on kombu's Redis and in-memory transports: one round trip to
the broker per reading, made by the metric reader's thread, never by a
request. A broker that cannot tell (or is down) leaves the reading out.

kombu's Redis transport keeps no key for an empty queue, so its passive
declare of an empty queue answers "not found": on kombu's virtual transports
(Redis, in-memory) that is a depth of 0, reported as such, not left out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery import current_app
from kombu.transport import virtual
from opentelemetry.metrics import CallbackOptions, Observation

from ..telemetry import metrics
from ..telemetry import names as n
from ..tools import effective

logger = logging.getLogger("mcptasks.telemetry")

_warned: set[str] = set()


def run_queues() -> list[str]:
    """The site's run queue, each tool's own queue and Celery's default."""
    app = current_app
    return [q for q in dict.fromkeys((*effective.configured_queues(), app.conf.task_default_queue)) if q]


def depths(options: CallbackOptions | None = None) -> Iterable[Observation]:
    observations: list[Observation] = []
    try:
        with current_app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            channel: Any = conn.default_channel
            for queue in run_queues():
                try:
                    count = int(channel.queue_declare(queue=queue, passive=True).message_count)
                except Exception:  # no such queue yet, or a broker that cannot say
                    if not isinstance(channel, virtual.Channel):
                        continue
                    count = 0  # a virtual transport's empty queue has no key (above)
                observations.append(Observation(count, {n.QUEUE_NAME: queue}))
    except Exception as exc:
        kind = type(exc).__name__
        if kind not in _warned:  # once per kind of failure, not every reading
            _warned.add(kind)
            logger.warning("the run queue's depth could not be read: %s", exc)
    return observations


def connect() -> None:
    metrics.observe("mcptasks.queue.depth", depths, "{message}", "Runs waiting in the Celery queue")
