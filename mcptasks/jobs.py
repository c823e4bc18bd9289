"""Celery tasks: a tool run, and the periodic maintenance."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import execution, lifecycle


@shared_task(
    name="mcptasks.run_task",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_task(task_id: str) -> str:
    return execution.run_task(task_id)


@shared_task(name="mcptasks.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    report = lifecycle.sweep()
    return {"redispatched": report.redispatched, "failed": report.failed}


@shared_task(name="mcptasks.purge_expired", ignore_result=True)
def purge_expired() -> int:
    return lifecycle.purge_expired()
