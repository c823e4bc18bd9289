"""The domain's API: every function that creates a task or changes its state.

Views, the admin, management commands and workers all call these. Each
successful change writes a ``TaskEvent`` and, once committed, sends
``signals.task_changed`` and logs a structured line (see ``events``).

The code lives by concern: ``creation``, ``quota`` (the per-owner count of
active tasks), ``transitions`` (the guarded status changes), ``runs`` (a
worker's lease), ``retries`` and ``slots`` (a tool's execution controls),
``maintenance`` (sweeper, prune and the counts' reconcile) and ``operator``
(retry and audit).
"""

from __future__ import annotations

from .creation import Answer, acreate_task, clamp_ttl, create_task
from .events import SYSTEM, EventKind, client_actor, operator_actor, worker_actor
from .maintenance import REDISPATCH_BACKOFF_MAX_FACTOR, SweepReport, expire_now, prune_expired, sweep
from .operator import RETRYABLE_STATUSES, audit_logger, note_result_retrieved, retry, retry_refusal
from .quota import QUOTA_LOCK_MARGIN, TooManyActiveTasks, reconcile
from .retries import schedule_retry, tool_retries
from .runs import (
    Run,
    claim,
    heartbeat,
    held_leases,
    release,
    renew_leases,
    set_status_message,
    start_run,
)
from .slots import free as free_slot
from .slots import held as slots_held
from .slots import renew as renew_slots
from .slots import take as take_slot
from .slots import tool_name_of, wait_for_slot
from .transitions import acancel, asubmit_input, cancel, complete, fail, finish_run, request_input, submit_input

__all__ = [
    "QUOTA_LOCK_MARGIN",
    "REDISPATCH_BACKOFF_MAX_FACTOR",
    "RETRYABLE_STATUSES",
    "SYSTEM",
    "Answer",
    "EventKind",
    "Run",
    "SweepReport",
    "TooManyActiveTasks",
    "acancel",
    "acreate_task",
    "asubmit_input",
    "audit_logger",
    "cancel",
    "claim",
    "clamp_ttl",
    "client_actor",
    "complete",
    "create_task",
    "expire_now",
    "fail",
    "finish_run",
    "free_slot",
    "heartbeat",
    "held_leases",
    "note_result_retrieved",
    "operator_actor",
    "prune_expired",
    "reconcile",
    "release",
    "renew_leases",
    "renew_slots",
    "request_input",
    "retry",
    "retry_refusal",
    "schedule_retry",
    "set_status_message",
    "slots_held",
    "start_run",
    "submit_input",
    "sweep",
    "take_slot",
    "tool_name_of",
    "tool_retries",
    "wait_for_slot",
    "worker_actor",
]
