"""Durable rows: the source of truth for every task.

Status is never written here directly: ``mcptasks.tasks.transitions`` owns every
transition and guards each one with a compare-and-set on the current status.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models import Q


def new_task_id() -> str:
    """192 random bits, URL- and header-safe (``[A-Za-z0-9_-]``, 32 chars)."""
    return secrets.token_urlsafe(24)


class TaskStatus(models.TextChoices):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED)
TERMINAL_STATUSES = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class Era(models.TextChoices):
    """Which protocol generation created the task (its wire rules differ)."""

    MODERN = "2026-07-28", "2026-07-28 tasks extension"
    LEGACY = "2025-11-25", "2025-11-25 experimental tasks"


@functools.cache
def _json_fields(model: type[models.Model]) -> frozenset[str]:
    return frozenset(f.attname for f in model._meta.concrete_fields if isinstance(f, models.JSONField))


@functools.cache
def _datetime_fields(model: type[models.Model]) -> frozenset[str]:
    return frozenset(f.attname for f in model._meta.concrete_fields if isinstance(f, models.DateTimeField))


class TaskManager(models.Manager["Task"]):
    def from_row(self, names: Sequence[str], row: Sequence[Any]) -> Task:
        """A task from a raw SQL row holding the fields ``names``, in order.
        JSON columns arrive as text from Django's Postgres loader. SQLite's
        driver gives datetimes without their zone (the database's, UTC
        unless DATABASES sets TIME_ZONE): as the ORM does, they get it back,
        or they would be read as the process's local time."""
        from django.conf import settings as django_settings
        from django.db import connections
        from django.utils import timezone

        json_fields = _json_fields(self.model)
        datetime_fields = _datetime_fields(self.model)
        values = []
        for name, value in zip(names, row, strict=True):
            if name in json_fields and isinstance(value, str):
                value = json.loads(value)
            elif name in datetime_fields and value is not None and timezone.is_naive(value) and django_settings.USE_TZ:
                value = timezone.make_aware(value, connections[self.db].timezone)
            values.append(value)
        return self.model.from_db(self.db, list(names), values)


class Task(models.Model):
    id = models.CharField(primary_key=True, max_length=64, default=new_task_id, editable=False)
    owner = models.CharField(max_length=255, help_text="The caller's identity; only it may see the task.")
    tool_name = models.CharField(max_length=128)
    arguments = models.JSONField(default=dict)
    era = models.CharField(max_length=10, choices=Era.choices, default=Era.MODERN)
    #: Capabilities the client declared on the creating request: the task may
    #: only ask for input the client said it can give.
    client_capabilities = models.JSONField(default=dict)

    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.WORKING)
    status_message = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    ttl_ms = models.BigIntegerField(null=True, blank=True, help_text="From creation; null is unlimited.")
    expires_at = models.DateTimeField(null=True, blank=True)
    poll_interval_ms = models.PositiveIntegerField(default=1000)

    # Execution bookkeeping.
    attempts = models.PositiveIntegerField(default=0, help_text="Runs started since the last clean stop.")
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="Last time a run was enqueued.")
    lease_owner = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=255, blank=True, default="")
    #: First read of a finished task's outcome (the retrieval audit): on the
    #: row, so a poll of a finished task needs no second query.
    outcome_read_at = models.DateTimeField(null=True, blank=True)
    #: When a worker first claimed a run (later runs after input rounds or a
    #: lost worker keep it): the end of the task's queue wait.
    started_at = models.DateTimeField(null=True, blank=True)
    #: When the task reached its terminal status (set by the same write).
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set once a web process's poll snapshot may keep the task: from then on
    # every change of what a poll reads is announced (migration 0010's trigger).
    # The database default too: raw INSERTs that leave the column out stay valid.
    snapshot_watched = models.BooleanField(default=False, db_default=False, editable=False)
    #: The creating request's W3C trace context (``traceparent``,
    #: ``tracestate``): on the row, so a run redelivered after a worker died
    #: still joins the trace. Null when there was none (or telemetry is off).
    trace_context = models.JSONField(null=True, blank=True)
    #: The run ended with the tool's own error (a result with ``isError``):
    #: ``completed`` on the 2026-07-28 wire, ``failed`` on 2025-11-25. Set by
    #: the write that finishes the task, so operators can tell and filter it.
    tool_error = models.BooleanField(default=False, db_default=False, editable=False)

    objects = TaskManager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # tasks/list (legacy) and the admin: one owner's tasks, newest first.
            models.Index(fields=["owner", "-created_at", "id"], name="mcptasks_owner_created"),
            # The per-owner quota's reconcile (``ActiveTaskCount``): one owner's active tasks.
            models.Index(
                fields=["owner"],
                name="mcptasks_owner_active",
                condition=Q(status__in=["working", "input_required"]),
            ),
            # The sweeper: running tasks whose lease lapsed or never started.
            models.Index(
                fields=["lease_expires_at"],
                name="mcptasks_active_lease",
                condition=Q(status="working"),
            ),
            models.Index(
                fields=["dispatched_at"],
                name="mcptasks_unclaimed",
                condition=Q(status="working", lease_expires_at__isnull=True),
            ),
            # The prune: terminal tasks past their TTL.
            models.Index(
                fields=["expires_at"],
                name="mcptasks_terminal_expiry",
                condition=Q(status__in=["completed", "failed", "cancelled"]),
            ),
            models.Index(fields=["status", "-created_at"], name="mcptasks_status_created"),
            models.Index(fields=["tool_name", "-created_at"], name="mcptasks_tool_created"),
            # The admin's change list: all tasks, newest first.
            models.Index(fields=["-created_at", "id"], name="mcptasks_created"),
            # The admin's overview: tasks that finished in a recent window. Only
            # finished rows have an entry, so running tasks' updates skip it.
            models.Index(fields=["finished_at"], name="mcptasks_finished", condition=Q(finished_at__isnull=False)),
            # The admin's era filter: legacy tasks are the few, so index only them.
            models.Index(fields=["-created_at", "id"], name="mcptasks_legacy_created", condition=Q(era="2025-11-25")),
            # The admin's outcome filter: tool errors are the few, so index only them.
            models.Index(
                fields=["-created_at", "id"], name="mcptasks_tool_error_created", condition=Q(tool_error=True)
            ),
        ]
        permissions = [
            ("cancel_task", "Can cancel running or waiting tasks"),
            ("expire_task", "Can expire finished tasks now"),
            ("retry_task", "Can retry failed or cancelled tasks"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.id[:8]} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class TaskOverview(Task):
    """No table of its own: the admin's entry for the operators' overview, so
    the site's admin index lists it beside the tasks (``admin_overview``)."""

    class Meta:
        proxy = True
        verbose_name = "overview"
        verbose_name_plural = "overview"
        default_permissions = ()


class ActiveTaskCount(models.Model):
    """One slot of an owner's count of active (working or waiting) tasks.

    The owner's count is the sum of its slots: a creation adds one to a slot
    and a move to a terminal status takes one away, in the task's own
    statement or transaction (``mcptasks.tasks.quota``). Several slots let one
    owner's writers proceed without waiting for each other's commits, so a
    single slot may go below zero; only the sum means anything.
    """

    id = models.BigAutoField(primary_key=True)
    owner = models.CharField(max_length=255)
    #: 0 on the ORM path; on Postgres, from the id of the transaction that added it.
    slot = models.IntegerField(default=0)
    active = models.IntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "slot"], name="mcptasks_active_count_slot")]

    def __str__(self) -> str:
        return f"{self.owner} slot {self.slot}: {self.active:+d}"


class ToolSlot(models.Model):
    """One of the ``concurrency`` slots of a tool: a run holds it while its
    tool runs, so that at most that many runs of the tool run at once across
    every worker. ``expires_at`` follows the holder's lease (renewed with
    it): a slot whose holder died comes free when it lapses. Rows are made
    as a tool first needs them (``mcptasks.tasks.slots``)."""

    id = models.BigAutoField(primary_key=True)
    tool_name = models.CharField(max_length=200)
    slot = models.IntegerField()
    task_id = models.CharField(max_length=64, blank=True, default="")
    #: The run holding it (its lease owner), or empty when free.
    worker = models.CharField(max_length=255, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tool_name", "slot"], name="mcptasks_tool_slot")]

    def __str__(self) -> str:
        return f"{self.tool_name} slot {self.slot}: {self.worker or 'free'}"


class InputRequestState(models.TextChoices):
    PENDING = "pending"
    ANSWERED = "answered"
    #: The task ended while the request was outstanding.
    WITHDRAWN = "withdrawn"


class InputRequest(models.Model):
    """A question a task put to its client (elicitation, sampling, roots)."""

    # No index of its own: the (task, key) unique constraint leads with it.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="input_requests", db_index=False)
    key = models.CharField(max_length=255, help_text="Unique within the task for its whole life.")
    method = models.CharField(max_length=64)
    params = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=InputRequestState.choices, default=InputRequestState.PENDING)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["task", "key"], name="mcptasks_input_key_unique")]
        indexes = [
            models.Index(fields=["task"], name="mcptasks_input_pending", condition=Q(state="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.method}, {self.state})"


class TaskEvent(models.Model):
    """One audit record per transition (and per notable action) of a task."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: mcptasks_event_task_at leads with it.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events", db_index=False)
    at = models.DateTimeField()
    kind = models.CharField(max_length=32, help_text="created, transition, input, cancel_requested, ...")
    from_status = models.CharField(max_length=16, blank=True, default="")
    to_status = models.CharField(max_length=16, blank=True, default="")
    actor = models.CharField(max_length=255, help_text="client:<owner>, worker:<name>, operator:<user> or system")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["task", "at", "id"]
        indexes = [models.Index(fields=["task", "at"], name="mcptasks_event_task_at")]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_status}->{self.to_status} by {self.actor}"


# The 2025-era session wire -----------------------------------------------------------


def new_session_id() -> str:
    """256 random bits in visible ASCII (``[A-Za-z0-9_-]``), as ``Mcp-Session-Id`` requires."""
    return secrets.token_urlsafe(32)


class LegacySession(models.Model):
    """An ``initialize`` session of the 2025-era wire (``Mcp-Session-Id``).

    Durable, so that any web process can serve any request of the session.
    Only the identity that opened it may use it.
    """

    id = models.CharField(primary_key=True, max_length=64, default=new_session_id, editable=False)
    owner = models.CharField(max_length=255)
    protocol_version = models.CharField(max_length=10)
    client_capabilities = models.JSONField(default=dict)
    client_info = models.JSONField(default=dict)
    #: Set by ``logging/setLevel``; empty until then (no log notifications).
    log_level = models.CharField(max_length=16, blank=True, default="")
    #: URIs passed to ``resources/subscribe``.
    resource_subscriptions = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField()
    #: When ``notifications/initialized`` arrived.
    initialized_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField()
    #: When the client ended it (``DELETE``); a closed session answers 404.
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["last_seen_at"], name="mcptasks_session_seen")]

    def __str__(self) -> str:
        return f"session {self.id[:8]} ({self.protocol_version}, {self.owner})"


class LegacyTask(models.Model):
    """The session a 2025-era task was created in: where its
    ``notifications/tasks/status`` go, and (for anonymous callers) the only
    session that may see it."""

    task = models.OneToOneField(Task, primary_key=True, on_delete=models.CASCADE, related_name="legacy")
    session_id = models.CharField(max_length=64, db_index=True)
    #: The creating request's ``progressToken`` (a string or an integer), valid
    #: for the task's life: its progress goes to the session as
    #: ``notifications/progress`` under it. ``None``: the request had none.
    progress_token = models.JSONField(null=True, blank=True, default=None)

    def __str__(self) -> str:
        return f"{self.task_id} in session {self.session_id[:8]}"
