"""The Postgres store's operations on a task's path (``postgres_off_path`` has the rest): each its statement
in ``queries.sql``, run through ``sql`` on the thread's connection or, for the ``a*`` forms, on the loop's
(on a thread where ``sql.loop_available`` says no). The row a statement returns is the row announced."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connection, connections, models, transaction
from django.utils import timezone

from ...conf import settings
from ...models import TERMINAL_STATUSES, InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from ...telemetry import metrics
from ...threads import on_a_thread
from .. import dispatch, events, quota, sql
from ..events import STATUS_MESSAGE, EventKind, announce
from .orm import Claimed, Decide, Ending, Json

#: What a run asks: key -> method and params.
Questions = Mapping[str, Json]

_COLUMNS = [field.attname for field in Task._meta.concrete_fields]
#: The columns whose values Django adapts for the driver; psycopg sends the rest as they are.
_ADAPTED_FIELDS = [f for f in Task._meta.concrete_fields if isinstance(f, models.JSONField | models.IntegerField)]
#: Every status, question state and event kind under its own name, and the terminal statuses:
#: passed to each statement (``sql`` gives a statement the keys it names).
_FIXED: dict[str, Any] = {v.value: v.value for kinds in (TaskStatus, InputRequestState, EventKind) for v in kinds}
_FIXED["terminal"] = [str(status) for status in TERMINAL_STATUSES]


def column_params(task: Task) -> dict[str, Any]:
    """A new task's columns as the ORM would save them, adapted only where Django changes the value."""
    params = {name: getattr(task, name) for name in _COLUMNS}
    db = connections[Task.objects.db]
    for field in _ADAPTED_FIELDS:
        params[field.attname] = field.get_db_prep_save(params[field.attname], db)
    return params


def statement(name: str, **params: Any) -> sql.Result:
    """``name`` on the thread's connection, its rows read."""
    cursor = sql.execute(name, {**_FIXED, **params})
    names = sql.column_names(cursor)
    return sql.Result(names, cursor.fetchall() if names else [], cursor.rowcount)


async def astatement(name: str, **params: Any) -> sql.Result:
    """``name`` on the loop's connections, or on a thread where the loop cannot reach the store."""
    if not sql.loop_available():
        return await on_a_thread(lambda: statement(name, **params))
    return await sql.aexecute(name, {**_FIXED, **params})


def task_of(result: sql.Result, columns: int | None = None) -> Task | None:
    """The task of the result's row (its first ``columns``), or ``None``."""
    row = result.first()
    return None if row is None else Task.objects.from_row(result.names[:columns], row[:columns])


class PostgresTaskPath:
    """The operations of a task's ordinary life; the store is ``postgres_off_path.PostgresStore``."""

    name = "postgres"

    def _create_params(
        self, task: Task, actor: str, detail: Json, answered: Json, exclusive: bool = False
    ) -> dict[str, Any] | None:
        """``task_create``'s; ``None`` near the quota unless the caller holds the owner's lock alone."""
        limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
        lock_key, below = None, limit
        if limit is not None and not exclusive:
            if limit <= quota.QUOTA_LOCK_MARGIN:
                return None
            lock_key, below = quota.quota_lock_key(task.owner), limit - quota.QUOTA_LOCK_MARGIN
        answers = {key: {"method": a.method, "params": a.params, "response": a.response} for key, a in answered.items()}
        params = {**column_params(task), "actor": actor, "lock_key": lock_key, "below": below}
        params["answers"] = sql.db_value(InputRequest, "params", answers)
        params["detail"] = sql.db_value(TaskEvent, "detail", dict(detail))
        return params

    def insert_created(self, task: Task, actor: str, detail: Json, answered: Json) -> None:
        """``task_create``, near the quota under the owner's lock alone, or ``TooManyActiveTasks``."""
        params = self._create_params(task, actor, detail, answered)
        if params is None or statement("task_create", **params).rowcount != 1:
            limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
            assert limit is not None, "without a quota the statement always inserts"
            with transaction.atomic():
                statement("quota_lock_exclusive", lock_key=quota.quota_lock_key(task.owner))
                params = self._create_params(task, actor, detail, answered, exclusive=True)
                assert params is not None, "the exclusive lock is held"
                if statement("task_create", **params).rowcount != 1:
                    raise quota.TooManyActiveTasks(limit)
        task._state.adding = False
        task._state.db = connection.alias

    async def acreate(self, task: Task, actor: str, detail: Json, create: Callable[[], Task]) -> Task | None:
        """``task_create`` on the loop, then its signals and the run's publish; ``None`` near the quota."""
        if not sql.loop_available():
            return await on_a_thread(create)
        send = dispatch.loop_sender()
        if send is None:
            raise RuntimeError("no runtime installed that sends runs from the event loop")
        params = self._create_params(task, actor, detail, {})
        if params is None or (await sql.aexecute("task_create", {**_FIXED, **params})).rowcount != 1:
            return None
        task._state.adding = False
        task._state.db = Task.objects.db
        await events.aannounce_created(task, actor)
        metrics.task_created(task.tool_name, committed=True)
        await send(task.id, dispatch.route(task.tool_name))
        return task

    @staticmethod
    def _poll(task_id: str, owner: str, actor: str) -> dict[str, Any]:
        return {"task_id": task_id, "owner": owner, "now": timezone.now(), "actor": actor}

    def lookup(self, task_id: str, owner: str, fields: Sequence[str]) -> Task | None:
        return task_of(statement("task_lookup", task_id=task_id, owner=owner), len(fields))

    def poll(self, task_id: str, owner: str, fields: Sequence[str], *, actor: str) -> Task | None:
        return task_of(statement("task_poll", **self._poll(task_id, owner, actor)), len(fields))

    async def alookup(self, task_id: str, owner: str, fields: Sequence[str]) -> Task | None:
        return task_of(await astatement("task_lookup", task_id=task_id, owner=owner), len(fields))

    async def apoll(self, task_id: str, owner: str, fields: Sequence[str], *, actor: str) -> Task | None:
        return task_of(await astatement("task_poll", **self._poll(task_id, owner, actor)), len(fields))

    def mark_outcome_read(self, task: Task, fields: Sequence[str], *, actor: str) -> bool:
        result = statement("task_poll", **self._poll(task.id, task.owner, actor))
        read = task_of(result, len(fields))
        task.outcome_read_at = read.outcome_read_at if read is not None else task.outcome_read_at
        return bool(read is not None and result.first()[-1])

    def claim(self, task_id: str, *, worker: str, actor: str, now: datetime, lease: datetime) -> Claimed:
        result = statement("run_claim", task_id=task_id, worker=worker, lease=lease, now=now, actor=actor)
        task = task_of(result, -1)
        if task is None:
            return None
        answers = result.first()[-1]
        return task, (json.loads(answers) if isinstance(answers, str) else answers) or {}

    def renew_leases(self, runs: dict[str, str], lease: datetime) -> set[str]:
        result = statement("lease_renew", task_ids=list(set(runs.values())), workers=list(runs), lease=lease)
        return {row[0] for row in result.rows}

    def set_status_message(self, task_id: str, message: str, *, worker: str, actor: str, progress: Any) -> bool:
        params = {"task_id": task_id, "message": message, "now": timezone.now(), "worker": worker}
        task = task_of(statement("run_status_message", **params))
        if task is not None:
            transaction.on_commit(
                lambda: events.announce_committed(task, TaskStatus.WORKING, actor, STATUS_MESSAGE, progress=progress)
            )
        return task is not None

    def release(self, task_id: str, *, worker: str) -> None:
        statement("lease_release", task_id=task_id, worker=worker, now=timezone.now())

    def end_run(self, end: Ending) -> bool:
        """``run_finish`` (the caller checked that the rule lets ``working`` move to ``to``)."""
        params = {**vars(end), "to": str(end.to), "now": timezone.now()}
        params.update(result=sql.db_value(Task, "result", end.result), error=sql.db_value(Task, "error", end.error))
        task = task_of(statement("run_finish", **params))
        if task is not None:
            announce(end.task_id, TaskStatus.WORKING, end.to, end.actor, EventKind.TRANSITION, task=task)
            metrics.task_finished(task.tool_name, end.to, tool_error=end.tool_error)
        return task is not None

    @staticmethod
    def _end(end: Ending) -> dict[str, Any]:
        now, cancelled = timezone.now(), end.to == TaskStatus.CANCELLED
        by = {"cancelled_at": now if cancelled else None, "cancelled_by": end.actor if cancelled else None}
        return {**vars(end), **by, "to": str(end.to), "now": now, "error": sql.db_value(Task, "error", end.error)}

    def end(self, end: Ending) -> bool:
        result = statement("task_end", **self._end(end))
        task = task_of(result, -1)
        if task is not None:
            metrics.task_finished(task.tool_name, task.status, committed=False)
            announce(end.task_id, result.first()[-1], task.status, end.actor, EventKind.TRANSITION, task=task)
        return task is not None

    async def aend(self, end: Ending) -> bool:
        """``task_end`` on the event loop, in autocommit."""
        if not sql.loop_available():
            return await on_a_thread(lambda: self.end(end))
        result = await sql.aexecute("task_end", {**_FIXED, **self._end(end)})
        task = task_of(result, -1)
        if task is not None:
            metrics.task_finished(task.tool_name, task.status, committed=True)
            await events.aannounce_committed(task, result.first()[-1], end.actor, EventKind.TRANSITION)
        return task is not None

    def request_input(
        self, task_id: str, requests: Questions, *, allowed: list[str], worker: str, actor: str, message: str
    ) -> bool:
        """``input_request`` (the caller checked that the rule lets ``working`` ask)."""
        asked = {key: {"method": req["method"], "params": req.get("params", {})} for key, req in requests.items()}
        params = {"task_id": task_id, "now": timezone.now(), "worker": worker, "message": message, "actor": actor}
        params["requests"] = sql.db_value(InputRequest, "params", asked)
        params["detail"] = sql.db_value(TaskEvent, "detail", {"keys": sorted(requests)})
        task = task_of(statement("input_request", **params))
        if task is not None:
            announce(task_id, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, actor, EventKind.TRANSITION, task=task)
        return task is not None

    @staticmethod
    def _answer(task_id: str, responses: Json, accepted: list[str], resume: bool, actor: str) -> dict[str, Any]:
        answers = sql.db_value(InputRequest, "response", {key: responses[key] for key in accepted})
        detail = sql.db_value(TaskEvent, "detail", {"keys": accepted})
        return dict(task_id=task_id, now=timezone.now(), actor=actor, answers=answers, resume=resume, detail=detail)

    def submit_input(self, task_id: str, responses: Json, *, actor: str, decide: Decide) -> list[str]:
        """``task_lock``, ``input_pending``, ``input_answer``, in one transaction."""
        with transaction.atomic():
            locked = statement("task_lock", task_id=task_id).first()
            if locked is None:
                return []
            answer = decide(locked[0], statement("input_pending", task_id=task_id).rows)
            if answer is None:
                return []
            accepted, resume, _ = answer
            task = task_of(statement("input_answer", **self._answer(task_id, responses, accepted, resume, actor)))
            if resume:
                announce(task_id, locked[0], TaskStatus.WORKING, actor, EventKind.TRANSITION, task=task)
                dispatch.enqueue_after_commit(task_id)
            else:
                announce(task_id, locked[0], locked[0], actor, EventKind.INPUT)
            return accepted

    async def asubmit_input(self, task_id: str, responses: Json, *, actor: str, decide: Decide) -> list[str]:
        """``submit_input`` on the loop; a resumed task's run published from the loop once committed."""
        if not sql.loop_available():
            return await on_a_thread(lambda: self.submit_input(task_id, responses, actor=actor, decide=decide))
        async with sql.atransaction() as db:
            locked = (await db.execute("task_lock", {"task_id": task_id})).first()
            if locked is None:
                return []
            answer = decide(locked[0], (await db.execute("input_pending", {**_FIXED, "task_id": task_id})).rows)
            if answer is None:
                return []
            accepted, resume, pending = answer
            answered = {**_FIXED, **self._answer(task_id, responses, accepted, resume, actor)}
            left = await db.execute("input_answer", answered)
        task = Task.objects.from_row(left.names, left.first())
        if resume:
            await events.aannounce_committed(task, locked[0], actor, EventKind.TRANSITION)
            send = dispatch.loop_sender()
            assert send is not None, "the caller checks that a loop sender is installed"
            await send(task_id, dispatch.route(task.tool_name))
        else:
            remaining = {key: asked for key, asked in pending.items() if key not in accepted}
            await events.aannounce_committed(task, locked[0], actor, EventKind.INPUT, pending=remaining)
        return accepted
