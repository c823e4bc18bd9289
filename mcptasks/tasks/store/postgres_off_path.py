"""The Postgres store's writes off a task's ordinary path: a tool's retries and concurrency slots
(``controls.sql``), and those of the sweeper, prune and expiry (``maintenance.sql``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ...models import TaskEvent, TaskStatus
from .. import sql
from ..events import STATUS_MESSAGE, SYSTEM, announce
from .postgres import PostgresTaskPath, statement, task_of


class PostgresStore(PostgresTaskPath):
    """The store ``store.backend()`` gives on Postgres: ``PostgresTaskPath``'s operations and these."""

    def schedule_retry(
        self, task_id: str, *, worker: str, actor: str, now: datetime, due: datetime, message: str, detail: Any
    ) -> bool:
        params = {"task_id": task_id, "worker": worker, "now": now, "due": due, "message": message, "actor": actor}
        task = task_of(statement("run_retry", **params, detail=sql.db_value(TaskEvent, "detail", detail)))
        if task is not None:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE, task=task)
        return task is not None

    def wait_for_slot(self, task_id: str, *, now: datetime, due: datetime, message: str) -> bool:
        task = task_of(statement("run_slot_wait", task_id=task_id, now=now, due=due, message=message))
        if task is not None and task.updated_at == now:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, SYSTEM, STATUS_MESSAGE, task=task)
        return task is not None

    def take_slot(
        self, tool_name: str, limit: int, *, task_id: str, worker: str, now: datetime, lease: datetime
    ) -> int | None:
        tool = {"tool": tool_name, "limit": limit}
        statement("slot_rows", **tool)
        row = statement("slot_take", **tool, task_id=task_id, worker=worker, lease=lease, now=now).first()
        return None if row is None else int(row[0])

    def renew_slots(self, workers: list[str], lease: datetime) -> None:
        statement("slot_renew", lease=lease, workers=workers)

    def free_slot(self, worker: str) -> None:
        statement("slot_free", worker=worker)

    def redispatch(self, task_id: str, *, attempts: int, now: datetime) -> bool:
        return bool(statement("run_redispatch", task_id=task_id, now=now, attempts=attempts, actor=SYSTEM).rowcount)

    def delete_expired_batch(self, now: datetime, size: int) -> int:
        """``prune_batch``, where Django's delete collector would load each task to cascade in Python."""
        return statement("prune_batch", now=now, size=size).rowcount

    def mark_expired(self, task_id: str, *, now: datetime, actor: str) -> None:
        statement("task_expire", task_id=task_id, now=now, actor=actor)
