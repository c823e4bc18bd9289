"""The metrics: what the endpoint answers, and what tasks do.

Instruments come from the global meter provider (a proxy until the site sets
one). Counters of task changes count once the change is committed. The
gauges read the per-owner counter table (``ActiveTaskCount``: a row per
owner and writer, never per task) and an index range capped at
``WAITING_COUNT_CAP`` rows, so a collection costs the same at ten million
tasks as at ten.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.apps import apps
from django.db import DatabaseError, connection, transaction
from django.db.models import Sum
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Observation

from ..conf import package_version, settings
from ..models import ActiveTaskCount, Task, TaskStatus
from . import NATIVE, bounds
from . import names as n

logger = logging.getLogger("mcptasks.telemetry")

#: The tasks-waiting-for-input gauge counts at most this many rows.
WAITING_COUNT_CAP = 100_000

#: Boundaries (seconds) for the duration histograms: from a poll to a long run.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


@dataclass(frozen=True)
class Instruments:
    operation_duration: Histogram
    created: Counter
    started: Counter
    completed: Counter
    failed: Counter
    cancelled: Counter
    expired: Counter
    retried: Counter
    tool_retries: Counter
    run_duration: Histogram
    queue_wait: Histogram


@functools.cache
def meter() -> metrics.Meter:
    return metrics.get_meter(n.INSTRUMENTATION_NAME, package_version())


@functools.cache
def instruments() -> Instruments:
    m = meter()

    def counter(name: str, unit: str, description: str) -> Counter:
        return m.create_counter(name, unit=unit, description=description)

    def seconds(name: str, description: str) -> Histogram:
        return m.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=DURATION_BUCKETS
        )

    return Instruments(
        operation_duration=seconds("mcp.server.operation.duration", "MCP requests served, by method and outcome"),
        created=counter("mcptasks.task.created", "{task}", "Tasks created"),
        started=counter("mcptasks.task.started", "{run}", "Runs started"),
        completed=counter("mcptasks.task.completed", "{task}", "Tasks that ended completed"),
        failed=counter("mcptasks.task.failed", "{task}", "Tasks that ended failed"),
        cancelled=counter("mcptasks.task.cancelled", "{task}", "Tasks that ended cancelled"),
        expired=counter("mcptasks.task.expired", "{task}", "Finished tasks pruned when their TTL ran out"),
        retried=counter("mcptasks.task.retried", "{run}", "Runs started again after a run was lost"),
        tool_retries=counter(
            "mcptasks.task.tool_retries", "{retry}", "Attempts scheduled after a tool raised an exception it retries on"
        ),
        run_duration=seconds("mcptasks.task.run.duration", "One run of a task, from its start to its end"),
        queue_wait=seconds("mcptasks.task.queue.wait", "From a task's creation (or resumption) to its run's start"),
    )


def operation_finished(method: str, tool: str | None, error_type: str | None, seconds: float) -> None:
    attributes = {n.MCP_METHOD: bounds.method(method)}
    if tool is not None:
        attributes[n.TOOL_NAME] = bounds.tool(tool)
    if error_type is not None:
        attributes[n.ERROR_TYPE] = bounds.text(error_type)
    instruments().operation_duration.record(seconds, attributes)


def task_created(tool: str, *, committed: bool = False) -> None:
    """A task was created: inside its transaction, or ``committed`` already
    (the event loop's autocommit statement)."""
    if settings.TELEMETRY == NATIVE:
        _count(instruments().created, tool, committed=committed)


_TERMINAL: dict[str, str] = {
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.CANCELLED: "cancelled",
}


#: A finished task's ``mcptasks.task.outcome`` by status, when it is no tool error.
_OUTCOME: dict[str, str] = {
    TaskStatus.COMPLETED: "success",
    TaskStatus.FAILED: "error",
    TaskStatus.CANCELLED: "cancelled",
}


def task_finished(tool: str, status: str, *, committed: bool = False, tool_error: bool = False) -> None:
    """A task reached a terminal status: inside its transaction, or
    ``committed`` already (a statement on the event loop). ``tool_error``:
    its run ended with the tool's ``isError`` result."""
    if settings.TELEMETRY == NATIVE and status in _TERMINAL:
        outcome = n.TOOL_ERROR if tool_error else _OUTCOME[status]
        _count(getattr(instruments(), _TERMINAL[status]), tool, committed=committed, outcome=outcome)


def tasks_expired(count: int) -> None:
    if count and settings.TELEMETRY == NATIVE:
        instruments().expired.add(count)


def run_started(tool: str, attempt: int, wait_seconds: float | None, queue: str | None = None) -> None:
    i = instruments()
    attributes = {n.TOOL_NAME: bounds.tool(tool)}
    i.started.add(1, attributes)
    if attempt > 1:
        i.retried.add(1, attributes)
    if wait_seconds is not None:
        waited = {**attributes, n.QUEUE_NAME: queue} if queue else attributes
        i.queue_wait.record(max(0.0, wait_seconds), waited)


def tool_retry(tool: str, queue: str | None) -> None:
    """A tool raised an exception it retries on: another attempt is scheduled."""
    if settings.TELEMETRY == NATIVE:
        attributes = {n.TOOL_NAME: tool, n.QUEUE_NAME: queue} if queue else {n.TOOL_NAME: tool}
        instruments().tool_retries.add(1, attributes)


def run_finished(tool: str, outcome: str, seconds: float) -> None:
    instruments().run_duration.record(seconds, {n.TOOL_NAME: bounds.tool(tool), n.RUN_OUTCOME: outcome})


def _count(counter: Counter, tool: str, *, committed: bool, outcome: str | None = None) -> None:
    attributes = {n.TOOL_NAME: bounds.tool(tool)}
    if outcome is not None:
        attributes[n.TASK_OUTCOME] = outcome
    if committed:  # on the loop, where on_commit would touch the connection synchronously
        counter.add(1, attributes)
    else:
        transaction.on_commit(lambda: counter.add(1, attributes))


# Gauges -------------------------------------------------------------------------


def active_tasks(options: CallbackOptions | None = None) -> Iterable[Observation]:
    """Tasks working and tasks waiting for input, across every process."""
    if not apps.ready:
        return []  # a reading while Django is still starting
    try:
        active = ActiveTaskCount.objects.aggregate(n=Sum("active"))["n"] or 0
        waiting = Task.objects.filter(status=TaskStatus.INPUT_REQUIRED).order_by()[:WAITING_COUNT_CAP].count()
    except DatabaseError:
        logger.warning("the task gauges could not be read", exc_info=True)
        return []
    finally:
        if not connection.in_atomic_block:
            connection.close()  # the exporter's thread keeps no connection between readings
    return [
        Observation(max(0, active - waiting), {n.TASK_STATUS: TaskStatus.WORKING.value}),
        Observation(waiting, {n.TASK_STATUS: TaskStatus.INPUT_REQUIRED.value}),
    ]


_registered: set[str] = set()


def observe(
    name: str, callback: Callable[[CallbackOptions], Iterable[Observation]], unit: str, description: str
) -> bool:
    """Register an observable gauge once per process (native mode, with
    ``TELEMETRY_GAUGES``). Returns whether it was registered now."""
    if settings.TELEMETRY != NATIVE or not settings.TELEMETRY_GAUGES or name in _registered:
        return False
    _registered.add(name)
    meter().create_observable_gauge(name, callbacks=[callback], unit=unit, description=description)
    return True


def connect() -> None:
    """The task gauges (``AppConfig.ready``)."""
    observe("mcptasks.tasks.active", active_tasks, "{task}", "Tasks working or waiting for input, by status")
