"""The Postgres store: each operation is its named statement in
``queries.sql`` (a few under one row lock for answers), run through ``sql``
on the thread's connection or, for the ``a*`` forms, on the event loop's.
The row a statement returns is the row the change is announced with. Where
the loop's connections cannot be used (a role to assume:
``sql.loop_available``), the ``a*`` forms await the thread's on a thread."""

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
from .. import dispatch, quota, sql
from ..events import (
    STATUS_MESSAGE,
    SYSTEM,
    EventKind,
    aannounce_committed,
    aannounce_created,
    announce,
    announce_committed,
)
from .orm import Decide

_COLUMNS = [field.attname for field in Task._meta.concrete_fields]
#: The columns whose values Django adapts for the driver (JSON wrapped,
#: integers typed by their column); psycopg sends the rest as they are.
_ADAPTED_FIELDS = [f for f in Task._meta.concrete_fields if isinstance(f, models.JSONField | models.IntegerField)]


def column_params(task: Task) -> dict[str, Any]:
    """A new task's columns as a statement's parameters: what the ORM would
    save (``tests/test_sql_home.py`` holds the two equal), with
    ``get_db_prep_save`` called only where it changes the value, which saves
    most of its cost on every creation."""
    params = {name: getattr(task, name) for name in _COLUMNS}
    db = connections[Task.objects.db]
    for field in _ADAPTED_FIELDS:
        params[field.attname] = field.get_db_prep_save(params[field.attname], db)
    return params


def _row(name: str, params: Mapping[str, Any]) -> Task | None:
    """Run a statement that returns the task as it left it (or nothing)."""
    cursor = sql.execute(name, params)
    row = cursor.fetchone()
    return None if row is None else Task.objects.from_row(sql.column_names(cursor), row)


def _lookup_task(names: Sequence[str], row: Sequence[Any] | None, fields: int) -> Task | None:
    return None if row is None else Task.objects.from_row(names[:fields], row[:fields])


class Postgres:
    """Every operation one named statement (module docstring)."""

    name = "postgres"

    # Creation ----------------------------------------------------------------

    def _create_params(
        self, task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``task_create``'s parameters, but for the quota's."""
        params = column_params(task)
        answers = {key: {"method": a.method, "params": a.params, "response": a.response} for key, a in answered.items()}
        params.update(
            kind=EventKind.CREATED.value,
            actor=actor,
            detail=sql.db_value(TaskEvent, "detail", dict(detail)),
            answers=sql.db_value(InputRequest, "params", answers),
            answered=InputRequestState.ANSWERED.value,
        )
        return params

    def _created_statement(
        self, task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """``task_create``'s parameters far below the owner's quota (its lock
        shared), or ``None`` when the quota is too small for a creation to
        share its lock."""
        limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
        if limit is not None and limit <= quota.QUOTA_LOCK_MARGIN:
            return None
        params = self._create_params(task, actor, detail, answered)
        if limit is None:
            params.update(lock_key=None, below=None)
        else:
            params.update(lock_key=quota.quota_lock_key(task.owner), below=limit - quota.QUOTA_LOCK_MARGIN)
        return params

    def insert_created(self, task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Any]) -> None:
        """Count the task in its owner's quota, insert it, its answers and its
        ``created`` event (``task_create``; its own transaction, or the
        caller's), or raise ``TooManyActiveTasks``.

        Far below the quota the statement takes the owner's lock shared and
        holds it until it commits, so an exclusive checker still waits for this
        creation before it reads the count. Near it (where the statement inserts
        nothing), the owner's lock is taken alone (``quota_lock_exclusive``),
        which waits for every creation in flight, and the same statement counts
        afresh under it, against the quota itself.
        """
        params = self._created_statement(task, actor, detail, answered)
        if params is None or sql.execute("task_create", params).rowcount != 1:
            limit = settings.MAX_ACTIVE_TASKS_PER_OWNER
            assert limit is not None, "without a quota the statement always inserts"
            with transaction.atomic():
                sql.execute("quota_lock_exclusive", {"lock_key": quota.quota_lock_key(task.owner)})
                params = {**self._create_params(task, actor, detail, answered), "lock_key": None, "below": limit}
                if sql.execute("task_create", params).rowcount != 1:
                    raise quota.TooManyActiveTasks(limit)
        task._state.adding = False
        task._state.db = connection.alias

    async def acreate(
        self, task: Task, actor: str, detail: Mapping[str, Any], create: Callable[[], Task]
    ) -> Task | None:
        """``task_create`` on the event loop, in autocommit, then (committed)
        the same signals, then the run's publish through
        ``dispatch.loop_sender``. ``None``, having done nothing, near the
        owner's quota (the caller then creates on a thread); where the loop
        cannot write, the whole creation on a thread (its quota's refusal
        raised, as there)."""
        if not sql.loop_available():
            return await on_a_thread(create)
        send = dispatch.loop_sender()
        if send is None:
            raise RuntimeError("no runtime installed that sends runs from the event loop")
        params = self._created_statement(task, actor, detail, {})
        if params is None or (await sql.aexecute("task_create", params)).rowcount != 1:
            return None
        task._state.adding = False
        task._state.db = Task.objects.db
        await aannounce_created(task, actor)
        metrics.task_created(task.tool_name, committed=True)
        await send(task.id, dispatch.route(task.tool_name))
        return task

    # Reads ---------------------------------------------------------------------

    @staticmethod
    def _poll_params(task_id: str, owner: str, actor: str) -> dict[str, Any]:
        return {
            "task_id": task_id,
            "owner": owner,
            "now": timezone.now(),
            "terminal": sql.strings(TERMINAL_STATUSES),
            "kind": EventKind.RESULT_RETRIEVED.value,
            "actor": actor,
        }

    def lookup(self, task_id: str, owner: str, fields: Sequence[str]) -> Task | None:
        cursor = sql.execute("task_lookup", {"task_id": task_id, "owner": owner})
        return _lookup_task(sql.column_names(cursor), cursor.fetchone(), len(fields))

    def poll(self, task_id: str, owner: str, fields: Sequence[str], *, actor: str) -> Task | None:
        cursor = sql.execute("task_poll", self._poll_params(task_id, owner, actor))
        return _lookup_task(sql.column_names(cursor), cursor.fetchone(), len(fields))

    async def alookup(self, task_id: str, owner: str, fields: Sequence[str]) -> Task | None:
        if not sql.loop_available():
            return await on_a_thread(lambda: self.lookup(task_id, owner, fields))
        result = await sql.aexecute("task_lookup", {"task_id": task_id, "owner": owner})
        return _lookup_task(result.names, result.first(), len(fields))

    async def apoll(self, task_id: str, owner: str, fields: Sequence[str], *, actor: str) -> Task | None:
        if not sql.loop_available():
            return await on_a_thread(lambda: self.poll(task_id, owner, fields, actor=actor))
        result = await sql.aexecute("task_poll", self._poll_params(task_id, owner, actor))
        return _lookup_task(result.names, result.first(), len(fields))

    def mark_outcome_read(self, task: Task, fields: Sequence[str], *, actor: str) -> bool:
        cursor = sql.execute("task_poll", self._poll_params(task.id, task.owner, actor))
        row = cursor.fetchone()
        read = _lookup_task(sql.column_names(cursor), row, len(fields))
        task.outcome_read_at = read.outcome_read_at if read is not None else task.outcome_read_at
        return bool(row is not None and row[-1])

    # Runs ----------------------------------------------------------------------

    def claim(
        self, task_id: str, *, worker: str, actor: str, now: datetime, lease: datetime
    ) -> tuple[Task, dict[str, Any]] | None:
        params = {
            "task_id": task_id,
            "worker": worker,
            "lease": lease,
            "now": now,
            "working": TaskStatus.WORKING.value,
            "kind": EventKind.RUN_STARTED.value,
            "actor": actor,
            "answered": InputRequestState.ANSWERED.value,
        }
        cursor = sql.execute("run_claim", params)
        row = cursor.fetchone()
        if row is None:
            return None
        answers = json.loads(row[-1]) if isinstance(row[-1], str) else row[-1]
        return Task.objects.from_row(sql.column_names(cursor)[:-1], row[:-1]), answers or {}

    def renew_leases(self, runs: dict[str, str], lease: datetime) -> set[str]:
        params = {
            "task_ids": list(set(runs.values())),
            "workers": list(runs),
            "lease": lease,
            "working": TaskStatus.WORKING.value,
        }
        return {row[0] for row in sql.execute("lease_renew", params).fetchall()}

    def set_status_message(self, task_id: str, message: str, *, worker: str, actor: str, progress: Any) -> bool:
        now = timezone.now()
        params = {
            "task_id": task_id,
            "message": message,
            "now": now,
            "working": TaskStatus.WORKING.value,
            "worker": worker,
        }
        task = _row("run_status_message", params)
        if task is None:
            return False
        transaction.on_commit(
            lambda: announce_committed(task, TaskStatus.WORKING, actor, STATUS_MESSAGE, progress=progress)
        )
        return True

    def release(self, task_id: str, *, worker: str) -> None:
        sql.execute("lease_release", {"task_id": task_id, "worker": worker, "now": timezone.now()})

    def schedule_retry(
        self, task_id: str, *, worker: str, actor: str, now: datetime, due: datetime, message: str, detail: Any
    ) -> bool:
        params = {
            "task_id": task_id,
            "worker": worker,
            "working": TaskStatus.WORKING.value,
            "now": now,
            "due": due,
            "message": message,
            "kind": EventKind.TOOL_RETRY.value,
            "actor": actor,
            "detail": sql.db_value(TaskEvent, "detail", detail),
        }
        task = _row("run_retry", params)
        if task is not None:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE, task=task)
        return task is not None

    def wait_for_slot(self, task_id: str, *, now: datetime, due: datetime, message: str) -> bool:
        params = {"task_id": task_id, "working": TaskStatus.WORKING.value, "now": now, "due": due, "message": message}
        task = _row("run_slot_wait", params)
        if task is not None and task.updated_at == now:
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, SYSTEM, STATUS_MESSAGE, task=task)
        return task is not None

    # Transitions ---------------------------------------------------------------

    def end_run(
        self,
        task_id: str,
        *,
        to: str,
        allowed: list[str],
        worker: str,
        actor: str,
        result: Any,
        error: dict[str, Any] | None,
        message: str,
        tool_error: bool,
    ) -> bool:
        """``run_finish``: the lease holder's task is ``working`` (the caller
        checked that the rule lets ``working`` move to ``to``)."""
        params = {
            "task_id": task_id,
            "to": str(to),
            "now": timezone.now(),
            "result": sql.db_value(Task, "result", result),
            "error": sql.db_value(Task, "error", error),
            "message": message,
            "working": TaskStatus.WORKING.value,
            "worker": worker,
            "kind": EventKind.TRANSITION.value,
            "actor": actor,
            "tool_error": tool_error,
        }
        task = _row("run_finish", params)
        if task is None:
            return False
        announce(task_id, TaskStatus.WORKING, to, actor, EventKind.TRANSITION, task=task)
        metrics.task_finished(task.tool_name, to, tool_error=tool_error)
        return True

    @staticmethod
    def _end_params(
        task_id: str,
        to: str,
        allowed: list[str],
        actor: str,
        message: str,
        error: dict[str, Any] | None,
        lapsed_at: datetime | None,
    ) -> dict[str, Any]:
        now = timezone.now()
        cancelled = to == TaskStatus.CANCELLED
        return {
            "task_id": task_id,
            "from": allowed,
            "to": str(to),
            "now": now,
            "actor": actor,
            "message": message,
            "error": sql.db_value(Task, "error", error),
            "cancelled_at": now if cancelled else None,
            "cancelled_by": actor if cancelled else None,
            "lapsed_at": lapsed_at,
            "kind": EventKind.TRANSITION.value,
            "withdrawn": InputRequestState.WITHDRAWN.value,
            "input_required": TaskStatus.INPUT_REQUIRED.value,
            "pending": InputRequestState.PENDING.value,
        }

    @staticmethod
    def _ended(names: list[str], row: Any, *, committed: bool) -> tuple[Task, str] | None:
        """The row ``task_end`` left and the status it left, counted; ``None`` when nothing moved."""
        if row is None:
            return None
        task = Task.objects.from_row(names[:-1], row[:-1])
        metrics.task_finished(task.tool_name, task.status, committed=committed)
        return task, row[-1]

    def end(
        self,
        task_id: str,
        to: str,
        *,
        allowed: list[str],
        actor: str,
        message: str,
        error: dict[str, Any] | None = None,
        lapsed_at: datetime | None = None,
    ) -> bool:
        """``task_end``."""
        cursor = sql.execute("task_end", self._end_params(task_id, to, allowed, actor, message, error, lapsed_at))
        ended = self._ended(sql.column_names(cursor), cursor.fetchone(), committed=False)
        if ended is not None:
            announce(task_id, ended[1], ended[0].status, actor, EventKind.TRANSITION, task=ended[0])
        return ended is not None

    async def aend(self, task_id: str, to: str, *, allowed: list[str], actor: str, message: str) -> bool:
        """``task_end`` on the event loop, in autocommit."""
        if not sql.loop_available():
            return await on_a_thread(lambda: self.end(task_id, to, allowed=allowed, actor=actor, message=message))
        result = await sql.aexecute("task_end", self._end_params(task_id, to, allowed, actor, message, None, None))
        ended = self._ended(result.names, result.first(), committed=True)
        if ended is not None:
            await aannounce_committed(ended[0], ended[1], actor, EventKind.TRANSITION)
        return ended is not None

    def request_input(
        self,
        task_id: str,
        requests: Mapping[str, Mapping[str, Any]],
        *,
        allowed: list[str],
        worker: str,
        actor: str,
        message: str,
    ) -> bool:
        """``input_request`` (the caller checked that the rule lets ``working`` ask)."""
        asked = {key: {"method": req["method"], "params": req.get("params", {})} for key, req in requests.items()}
        params = {
            "task_id": task_id,
            "now": timezone.now(),
            "worker": worker,
            "message": message,
            "working": TaskStatus.WORKING.value,
            "input_required": TaskStatus.INPUT_REQUIRED.value,
            "pending": InputRequestState.PENDING.value,
            "requests": sql.db_value(InputRequest, "params", asked),
            "kind": EventKind.TRANSITION.value,
            "actor": actor,
            "detail": sql.db_value(TaskEvent, "detail", {"keys": sorted(requests)}),
        }
        task = _row("input_request", params)
        if task is None:
            return False
        announce(task_id, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, actor, EventKind.TRANSITION, task=task)
        return True

    @staticmethod
    def _answer_params(
        task_id: str, responses: Mapping[str, Any], accepted: list[str], resume: bool, actor: str
    ) -> dict[str, Any]:
        return {
            "task_id": task_id,
            "now": timezone.now(),
            "actor": actor,
            "answers": sql.db_value(InputRequest, "response", {key: responses[key] for key in accepted}),
            "answered": InputRequestState.ANSWERED.value,
            "pending": InputRequestState.PENDING.value,
            "resume": resume,
            "working": TaskStatus.WORKING.value,
            "input_required": TaskStatus.INPUT_REQUIRED.value,
            "input": EventKind.INPUT.value,
            "transition": EventKind.TRANSITION.value,
            "detail": sql.db_value(TaskEvent, "detail", {"keys": accepted}),
        }

    def submit_input(self, task_id: str, responses: Mapping[str, Any], *, actor: str, decide: Decide) -> list[str]:
        """``task_lock``, ``input_pending``, ``input_answer``, in one transaction."""
        with transaction.atomic():
            locked = sql.execute("task_lock", {"task_id": task_id}).fetchone()
            if locked is None:
                return []
            cursor = sql.execute("input_pending", {"task_id": task_id, "pending": InputRequestState.PENDING.value})
            answer = decide(locked[0], cursor.fetchall())
            if answer is None:
                return []
            accepted, resume, _ = answer
            task = _row("input_answer", self._answer_params(task_id, responses, accepted, resume, actor))
            if resume:
                announce(task_id, locked[0], TaskStatus.WORKING, actor, EventKind.TRANSITION, task=task)
                dispatch.enqueue_after_commit(task_id)
            else:
                announce(task_id, locked[0], locked[0], actor, EventKind.INPUT)
            return accepted

    async def asubmit_input(
        self, task_id: str, responses: Mapping[str, Any], *, actor: str, decide: Decide
    ) -> list[str]:
        """``submit_input``'s statements on the event loop, in one
        transaction. Once committed, a resumed task's run is published from
        the loop (the caller checks that a loop sender is installed)."""
        if not sql.loop_available():
            return await on_a_thread(lambda: self.submit_input(task_id, responses, actor=actor, decide=decide))
        async with sql.atransaction() as db:
            locked = (await db.execute("task_lock", {"task_id": task_id})).first()
            if locked is None:
                return []
            pending_state = {"task_id": task_id, "pending": InputRequestState.PENDING.value}
            answer = decide(locked[0], (await db.execute("input_pending", pending_state)).rows)
            if answer is None:
                return []
            accepted, resume, pending = answer
            left = await db.execute("input_answer", self._answer_params(task_id, responses, accepted, resume, actor))
        task = Task.objects.from_row(left.names, left.first())
        if resume:
            await aannounce_committed(task, locked[0], actor, EventKind.TRANSITION)
            send = dispatch.loop_sender()
            assert send is not None, "the caller checks that a loop sender is installed"
            await send(task_id, dispatch.route(task.tool_name))
        else:
            remaining = {key: asked for key, asked in pending.items() if key not in accepted}
            await aannounce_committed(task, locked[0], actor, EventKind.INPUT, pending=remaining)
        return accepted

    # Maintenance ---------------------------------------------------------------

    def redispatch(self, task_id: str, *, attempts: int, now: datetime) -> bool:
        params = {
            "task_id": task_id,
            "now": now,
            "attempts": attempts,
            "working": TaskStatus.WORKING.value,
            "kind": EventKind.REDISPATCHED.value,
            "actor": SYSTEM,
        }
        return bool(sql.execute("run_redispatch", params).rowcount)

    def delete_expired_batch(self, now: datetime, size: int) -> int:
        """``prune_batch``: the batch's rows and every row that refers to them.

        Django's delete collector would first load each doomed task, with its
        arguments and result, to cascade in Python. Rows some other transaction
        holds (an outcome being marked read) are skipped, not waited for.
        """
        params = {"terminal": sql.strings(TERMINAL_STATUSES), "now": now, "size": size}
        return int(sql.execute("prune_batch", params).rowcount)

    def mark_expired(self, task_id: str, *, now: datetime, actor: str) -> None:
        params = {
            "task_id": task_id,
            "now": now,
            "terminal": sql.strings(TERMINAL_STATUSES),
            "kind": EventKind.EXPIRED.value,
            "actor": actor,
        }
        sql.execute("task_expire", params)

    # Concurrency slots -----------------------------------------------------------

    def take_slot(
        self, tool_name: str, limit: int, *, task_id: str, worker: str, now: datetime, lease: datetime
    ) -> int | None:
        sql.execute("slot_rows", {"tool": tool_name, "limit": limit})
        params = {"tool": tool_name, "limit": limit, "task_id": task_id, "worker": worker, "lease": lease, "now": now}
        row = sql.execute("slot_take", params).fetchone()
        return None if row is None else int(row[0])

    def renew_slots(self, workers: list[str], lease: datetime) -> None:
        sql.execute("slot_renew", {"lease": lease, "workers": workers})

    def free_slot(self, worker: str) -> None:
        sql.execute("slot_free", {"worker": worker})
