"""A Celery task for the P3 floor (bench/celery_floor.py): Celery alone.

It does nothing and touches no database: it only tells its publisher it ran
(one LPUSH on the publisher's reply key), so that the publisher can keep one
message in flight at a time, as a P3 client keeps one task. Its options are
``mcptasks.run_task``'s, so a worker handles it the same way.
"""

from __future__ import annotations

import os

import redis
from celery import shared_task

#: One client per worker process; redis-py clients are safe to share between threads.
_replies: dict[int, redis.Redis] = {}


def _client() -> redis.Redis:
    pid = os.getpid()
    client = _replies.get(pid)
    if client is None:  # per process: a prefork pool forks after import
        client = _replies[pid] = redis.Redis.from_url(os.environ["REDIS_URL"])
    return client


@shared_task(name="bench.floor_noop", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def floor_noop(reply_key: str) -> None:
    _client().lpush(reply_key, b"1")
