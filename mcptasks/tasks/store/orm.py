"""The ORM store, for every database but Postgres (SQLite, MySQL, MariaDB,
Oracle): each operation in a transaction, its transitions a compare-and-set
through ``_transition``, announced from inside it (the snapshot read in the
change's transaction). The ``a*`` forms await the same operation on a thread
(Django's connection of that thread), so the event loop needs no Postgres."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection, models, transaction
from django.db.models import F, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ...models import TERMINAL_STATUSES, InputRequest, InputRequestState, Task, TaskEvent, TaskStatus, ToolSlot
from ...telemetry import metrics
from ...threads import on_a_thread
from .. import quota
from ..dispatch import enqueue_after_commit
from ..events import STATUS_MESSAGE, SYSTEM, EventKind, announce, record_event

T = TypeVar("T")

#: What a submission's answers do, decided by ``transitions`` under the task's lock.
Decide = Callable[[str, Iterable[Any]], tuple[list[str], bool, dict[str, Any]] | None]
#: A JSON object: a response, an event's detail.
Json = Mapping[str, Any]
#: A claimed run: its task and the answers its earlier runs were given.
Claimed = tuple[Task, dict[str, Any]] | None

_CLEAR_LEASE = {"lease_owner": "", "lease_expires_at": None}


@dataclass(frozen=True)
class Ending:
    """A move to a terminal ``to`` from one of ``allowed``: a run's (``end_run``, while ``worker`` holds the
    lease) or from outside it (``end``; with ``lapsed_at``, only if the lease had lapsed by then)."""

    task_id: str
    to: str
    allowed: list[str]
    actor: str
    message: str
    error: dict[str, Any] | None = None
    worker: str = ""
    result: Any = None
    tool_error: bool = False
    lapsed_at: datetime | None = None


def held(runs: dict[str, str]) -> QuerySet[Task]:
    """The tasks of ``runs`` (worker name -> task id) still ``working`` under their lease."""
    # A worker name is unique to its run, so the two lists pair themselves.
    return Task.objects.filter(pk__in=set(runs.values()), lease_owner__in=list(runs), status=TaskStatus.WORKING)


def _transition(
    task_id: str,
    *,
    to: str,
    allowed: list[str],
    actor: str,
    kind: str = EventKind.TRANSITION,
    fields: Mapping[str, Any] | None = None,
    extra_filter: Q | None = None,
    detail: Mapping[str, Any] | None = None,
) -> bool:
    """Move ``task_id`` to ``to`` if its status is one of ``allowed`` (the
    rule's, ``transitions.allowed_from``). Must run inside
    ``transaction.atomic``. Returns whether it moved."""
    row = Task.objects.select_for_update().filter(pk=task_id).values_list("status", "owner", "tool_name").first()
    if row is None or row[0] not in allowed:
        return False
    current, owner, tool = row
    now = timezone.now()
    update = Task.objects.filter(pk=task_id, status=current)
    if extra_filter is not None:
        update = update.filter(extra_filter)
    if to in TERMINAL_STATUSES:
        fields = {**(fields or {}), "finished_at": now}
    if not update.update(status=to, updated_at=now, **dict(fields or {})):
        return False
    record_event(task_id, kind, actor, now=now, from_status=current, to_status=to, detail=detail)
    if to in TERMINAL_STATUSES:
        quota.adjust(owner, -1)
    if to in TERMINAL_STATUSES and current == TaskStatus.INPUT_REQUIRED:
        # Questions are pending only while the task waits.
        InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING).update(
            state=InputRequestState.WITHDRAWN
        )
    announce(task_id, current, to, actor, kind)
    metrics.task_finished(tool, to, tool_error=bool((fields or {}).get("tool_error")))
    return True


class Orm:
    """Every operation through the ORM (module docstring)."""

    name = "orm"

    # Creation ----------------------------------------------------------------

    def insert_created(self, task: Task, actor: str, detail: Mapping[str, Any], answered: Mapping[str, Any]) -> None:
        """``task_create``'s twin: counted in the owner's quota
        (``quota.take_place``), inserted with its answers and its event."""
        with transaction.atomic():
            quota.take_place(task.owner)
            task.save(force_insert=True)
            InputRequest.objects.bulk_create(
                InputRequest(
                    task=task,
                    key=key,
                    method=a.method,
                    params=a.params,
                    response=a.response,
                    state=InputRequestState.ANSWERED,
                    answered_at=task.created_at,
                )
                for key, a in answered.items()
            )
            record_event(
                task.id, EventKind.CREATED, actor, now=task.created_at, to_status=TaskStatus.WORKING, detail=detail
            )

    async def acreate(
        self, task: Task, actor: str, detail: Mapping[str, Any], create: Callable[[], Task]
    ) -> Task | None:
        return await on_a_thread(create)  # the quota's refusal raised, as on a thread

    # Reads ---------------------------------------------------------------------

    def lookup(self, task_id: str, owner: str, fields: Sequence[str]) -> Task | None:
        return Task.objects.filter(pk=task_id, owner=owner).only(*fields).first()

    def poll(self, task_id: str, owner: str, fields: Sequence[str], *, actor: str) -> Task | None:
        task = self.lookup(task_id, owner, fields)
        if task is not None and task.status in TERMINAL_STATUSES and task.outcome_read_at is None:
            self.mark_outcome_read(task, fields, actor=actor)
        return task

    async def alookup(self, task_id: str, owner: str, fields: Sequence[str]) -> Task | None:
        return await on_a_thread(lambda: self.lookup(task_id, owner, fields))

    async def apoll(self, task_id: str, owner: str, fields: Sequence[str], *, actor: str) -> Task | None:
        return await on_a_thread(lambda: self.poll(task_id, owner, fields, actor=actor))

    def mark_outcome_read(self, task: Task, fields: Sequence[str], *, actor: str) -> bool:
        now = timezone.now()
        with transaction.atomic():
            first = Task.objects.filter(pk=task.id, status__in=TERMINAL_STATUSES, outcome_read_at__isnull=True).update(
                outcome_read_at=now
            )
            if first:
                record_event(task.id, EventKind.RESULT_RETRIEVED, actor, now=now, detail={"status": task.status})
        task.outcome_read_at = now
        return bool(first)

    # Runs ----------------------------------------------------------------------

    def claim(self, task_id: str, *, worker: str, actor: str, now: datetime, lease: datetime) -> Claimed:
        with transaction.atomic():
            got = (
                Task.objects.filter(pk=task_id, status=TaskStatus.WORKING)
                .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
                .update(
                    lease_owner=worker,
                    lease_expires_at=lease,
                    attempts=F("attempts") + 1,
                    started_at=Coalesce(F("started_at"), Value(now, output_field=models.DateTimeField())),
                )
            )
            if not got:
                return None
            task = Task.objects.get(pk=task_id)
            record_event(task_id, EventKind.RUN_STARTED, actor, now=now, detail={"attempt": task.attempts})
        answered = InputRequest.objects.filter(task_id=task_id, state=InputRequestState.ANSWERED)
        return task, dict(answered.values_list("key", "response"))

    def renew_leases(self, runs: dict[str, str], lease: datetime) -> set[str]:
        renewed = held(runs).update(lease_expires_at=lease)
        return set(runs) if renewed == len(runs) else set(held(runs).values_list("lease_owner", flat=True))

    def set_status_message(self, task_id: str, message: str, *, worker: str, actor: str, progress: Any) -> bool:
        now = timezone.now()
        with transaction.atomic():
            changed = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker).update(
                status_message=message, updated_at=now
            )
            if changed:
                announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE, progress=progress)
            return bool(changed)

    def release(self, task_id: str, *, worker: str) -> None:
        Task.objects.filter(pk=task_id, lease_owner=worker).update(
            lease_expires_at=None, lease_owner="", attempts=F("attempts") - 1, dispatched_at=timezone.now()
        )

    def schedule_retry(
        self, task_id: str, *, worker: str, actor: str, now: datetime, due: datetime, message: str, detail: Any
    ) -> bool:
        with transaction.atomic():
            moved = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker).update(
                lease_owner="",
                lease_expires_at=None,
                attempts=F("attempts") - 1,
                dispatched_at=due,
                status_message=message,
                updated_at=now,
            )
            if not moved:
                return False
            record_event(task_id, EventKind.TOOL_RETRY, actor, now=now, detail=detail)
            announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, actor, STATUS_MESSAGE)
        return True

    def wait_for_slot(self, task_id: str, *, now: datetime, due: datetime, message: str) -> bool:
        with transaction.atomic():
            waiting = Task.objects.filter(pk=task_id, status=TaskStatus.WORKING).filter(
                Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
            )
            changed = waiting.exclude(status_message=message).update(
                dispatched_at=due, status_message=message, updated_at=now
            )
            if changed:
                announce(task_id, TaskStatus.WORKING, TaskStatus.WORKING, SYSTEM, STATUS_MESSAGE)
                return True
            return bool(waiting.update(dispatched_at=due))

    # Transitions ---------------------------------------------------------------

    def end_run(self, end: Ending) -> bool:
        fields: dict[str, Any] = {"status_message": end.message, "tool_error": end.tool_error, **_CLEAR_LEASE}
        fields.update({"error": end.error} if end.error is not None else {"result": end.result})
        guard = Q(lease_owner=end.worker)
        with transaction.atomic():
            return _transition(
                end.task_id, to=end.to, allowed=end.allowed, actor=end.actor, extra_filter=guard, fields=fields
            )

    def end(self, end: Ending) -> bool:
        fields: dict[str, Any] = {"status_message": end.message, **_CLEAR_LEASE}
        if end.to == TaskStatus.CANCELLED:
            fields.update(cancel_requested_at=timezone.now(), cancelled_by=end.actor)
        else:
            fields.update(error=end.error)
        lapsed = end.lapsed_at
        guard = None if lapsed is None else Q(lease_expires_at__lt=lapsed) | Q(lease_expires_at__isnull=True)
        with transaction.atomic():
            return _transition(
                end.task_id, to=end.to, allowed=end.allowed, actor=end.actor, fields=fields, extra_filter=guard
            )

    async def aend(self, end: Ending) -> bool:
        return await on_a_thread(lambda: self.end(end))

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
        with transaction.atomic():
            mine = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.WORKING, lease_owner=worker)
            if not mine.exists():
                return False
            existing = set(
                InputRequest.objects.filter(task_id=task_id, key__in=list(requests)).values_list("key", flat=True)
            )
            # The questions first, so that the transition's snapshot lists them.
            InputRequest.objects.bulk_create(
                InputRequest(task_id=task_id, key=key, method=req["method"], params=req.get("params", {}))
                for key, req in requests.items()
                if key not in existing
            )
            moved = _transition(
                task_id,
                to=TaskStatus.INPUT_REQUIRED,
                allowed=allowed,
                actor=actor,
                extra_filter=Q(lease_owner=worker),
                fields={"status_message": message, "attempts": 0, **_CLEAR_LEASE},
                detail={"keys": sorted(requests)},
            )
            if not moved:
                transaction.set_rollback(True)
            return moved

    def submit_input(self, task_id: str, responses: Mapping[str, Any], *, actor: str, decide: Decide) -> list[str]:
        with transaction.atomic():
            status = Task.objects.select_for_update().filter(pk=task_id).values_list("status", flat=True).first()
            pending = InputRequest.objects.filter(task_id=task_id, state=InputRequestState.PENDING)
            answer = decide(status or "", pending.values_list("key", "method", "params"))
            if status is None or answer is None:
                return []
            accepted, resume, _ = answer
            now = timezone.now()
            for key in accepted:  # every one still pending: the row lock keeps other writers out
                pending.filter(key=key).update(
                    state=InputRequestState.ANSWERED, response=responses[key], answered_at=now
                )
            record_event(task_id, EventKind.INPUT, actor, now=now, detail={"keys": accepted})
            if resume:
                _transition(
                    task_id,
                    to=TaskStatus.WORKING,
                    allowed=[status],  # ``decide`` checked that the rule lets it resume
                    actor=actor,
                    fields={"status_message": "", "dispatched_at": now},
                )
                enqueue_after_commit(task_id)
            else:
                # Still waiting on other answers: listeners see the shorter list.
                Task.objects.filter(pk=task_id).update(updated_at=now)
                announce(task_id, status, status, actor, EventKind.INPUT)
            return accepted

    async def asubmit_input(
        self, task_id: str, responses: Mapping[str, Any], *, actor: str, decide: Decide
    ) -> list[str]:
        return await on_a_thread(lambda: self.submit_input(task_id, responses, actor=actor, decide=decide))

    # Maintenance ---------------------------------------------------------------

    def redispatch(self, task_id: str, *, attempts: int, now: datetime) -> bool:
        with transaction.atomic():
            moved = (
                Task.objects.filter(pk=task_id, status=TaskStatus.WORKING)
                .filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
                .update(lease_owner="", lease_expires_at=None, dispatched_at=now)
            )
            if moved:
                record_event(task_id, EventKind.REDISPATCHED, SYSTEM, now=now, detail={"attempts": attempts})
            return bool(moved)

    def delete_expired_batch(self, now: datetime, size: int) -> int:
        expired = Task.objects.filter(status__in=TERMINAL_STATUSES, expires_at__lt=now)
        ids = list(expired.order_by("expires_at").values_list("id", flat=True)[:size])
        if not ids:
            return 0
        InputRequest.objects.filter(task_id__in=ids).delete()
        TaskEvent.objects.filter(task_id__in=ids).delete()
        return Task.objects.filter(pk__in=ids, status__in=TERMINAL_STATUSES).delete()[1].get("mcptasks.Task", 0)

    def mark_expired(self, task_id: str, *, now: datetime, actor: str) -> None:
        if Task.objects.filter(pk=task_id, status__in=TERMINAL_STATUSES).update(expires_at=now):
            record_event(task_id, EventKind.EXPIRED, actor, now=now)

    # Concurrency slots -----------------------------------------------------------

    def take_slot(
        self, tool_name: str, limit: int, *, task_id: str, worker: str, now: datetime, lease: datetime
    ) -> int | None:
        """A compare-and-set on the slot row: row locks where the database
        has them (MariaDB's ``SKIP LOCKED`` included), SQLite's one writer
        at a time otherwise."""
        ToolSlot.objects.bulk_create(
            [ToolSlot(tool_name=tool_name, slot=n) for n in range(limit)], ignore_conflicts=True
        )
        free = Q(expires_at__isnull=True) | Q(expires_at__lt=now)
        with transaction.atomic():
            candidates = ToolSlot.objects.filter(free, tool_name=tool_name, slot__lt=limit).order_by("slot")
            if connection.features.has_select_for_update_skip_locked:
                # Lock one free slot, passing over those other runs are taking.
                candidates = candidates.select_for_update(skip_locked=True)[:1]
            for slot in candidates:
                # Compare-and-set: only if nobody took it since it was read.
                taken = ToolSlot.objects.filter(
                    free, pk=slot.pk, worker=slot.worker, expires_at=slot.expires_at
                ).update(task_id=task_id, worker=worker, expires_at=lease)
                if taken:
                    return slot.slot
        return None

    def renew_slots(self, workers: list[str], lease: datetime) -> None:
        ToolSlot.objects.filter(worker__in=workers).update(expires_at=lease)

    def free_slot(self, worker: str) -> None:
        ToolSlot.objects.filter(worker=worker).update(task_id="", worker="", expires_at=None)
