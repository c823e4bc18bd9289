"""Celery tasks: a tool run, and the periodic maintenance."""

from __future__ import annotations

import functools
import select
from collections.abc import Callable
from typing import Any, TypeVar

from celery import shared_task
from django.db import close_old_connections, connections

from ..tasks import lifecycle
from ..telemetry import runs as run_telemetry
from . import execution

Job = TypeVar("Job", bound=Callable[..., Any])


def with_usable_connections(job: Job) -> Job:
    """Django's connection upkeep around a request, around a job instead.

    With ``CELERY_DB_REUSE_MAX`` Celery keeps a worker's connections between
    tasks and no longer closes them; a connection that a database restart
    broke would then fail every later job of that process. So: before the
    job, drop a connection that is broken or past ``CONN_MAX_AGE`` (a restart
    costs a reconnect, not a lost run); after it, drop one the job saw fail.
    """

    @functools.wraps(job)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and _maybe_broken(conn.connection) and not conn.is_usable():
                conn.close()
        try:
            return job(*args, **kwargs)
        finally:
            close_old_connections()

    return wrapper  # type: ignore[return-value]


def _maybe_broken(dbapi_connection: Any) -> bool:
    """Whether an idle connection may have been broken, without a round trip.

    An idle connection's socket has nothing to read unless the server sent
    something unasked, which for a worker's connection means it is going
    away (a restart or ``pg_terminate_backend``: an error, then EOF). Only
    then is ``is_usable()``'s ``SELECT 1`` worth its round trip. A connection
    without a socket (SQLite) is always checked.
    """
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # no socket, or already closed
        return True
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


@shared_task(
    name="mcptasks.run_task",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
@with_usable_connections
def run_task(task_id: str) -> str:
    return run_telemetry.traced(execution.run_task, task_id)


@shared_task(name="mcptasks.sweep", ignore_result=True)
@with_usable_connections
def sweep() -> dict[str, Any]:
    report = lifecycle.sweep()
    return {"redispatched": report.redispatched, "failed": report.failed}


@shared_task(name="mcptasks.prune_expired", ignore_result=True)
@with_usable_connections
def prune_expired() -> int:
    return lifecycle.prune_expired()
