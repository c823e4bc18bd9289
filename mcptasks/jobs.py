"""Celery tasks: a tool run, and the periodic maintenance."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import close_old_connections, connections

from . import execution, lifecycle


@shared_task(
    name="mcptasks.run_task",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_task(task_id: str) -> str:
    # With CELERY_DB_REUSE_MAX, Celery keeps connections between runs; like
    # Django around a request, drop one that broke or aged out, so a database
    # restart costs a reconnect, not a lost run.
    _drop_unusable_connections()
    try:
        return execution.run_task(task_id)
    finally:
        close_old_connections()


def _drop_unusable_connections() -> None:
    close_old_connections()
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.is_usable():
            conn.close()


@shared_task(name="mcptasks.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    report = lifecycle.sweep()
    return {"redispatched": report.redispatched, "failed": report.failed}


@shared_task(name="mcptasks.purge_expired", ignore_result=True)
def purge_expired() -> int:
    return lifecycle.purge_expired()
