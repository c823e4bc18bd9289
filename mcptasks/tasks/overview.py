"""The figures of the admin's overview: what is running and waiting now, and
what happened over the last hour and the last day.

Every figure reads a bounded window of the tasks table through an index:
creations through ``mcptasks_created`` (``created_at``), finishes through
``mcptasks_finished`` (``finished_at``, finished rows only). The gauges read
the active-task counter (``quota``) and the waiting tasks alone, never the
whole table. On Postgres each figure is one grouped statement; elsewhere
(SQLite, the embedded default) the window's rows are read and grouped here,
with the same rules (``percentile`` interpolates as ``percentile_cont``).

What the figures mean:

* created per bucket, by the status the task has now;
* finished per bucket (by ``finished_at``), by terminal status;
* run time: from the first run's start to the finish, for tasks finished in
  the bucket (time spent waiting for input included);
* queue wait: from creation to the first run's start, for tasks created in
  the bucket. A task still queued counts with its wait so far, and one that
  ended before it started with its wait until then, so a backlog shows at
  once instead of after it drains;
* failures by tool: tasks that finished ``failed`` in the window (protocol
  failures), and apart from them tasks whose tool returned an error result
  (``tool_error``: ``completed`` on the 2026-07-28 wire, ``failed`` on 2025-11-25).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import caches
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from ..conf import settings
from ..models import ACTIVE_STATUSES, TERMINAL_STATUSES, ActiveTaskCount, Task, TaskStatus
from ..tools import effective
from ..tools.registry import registry
from . import sql
from .store import on_postgres

#: The statuses a creation is counted under, in the order charts stack them.
CREATED_STATUSES: tuple[str, ...] = (*ACTIVE_STATUSES, *TERMINAL_STATUSES)
#: How the overview names Celery's default queue (the domain does not read Celery's configuration).
DEFAULT_QUEUE_LABEL = "(default)"
#: How many tools the failures list names (the rest are summed as "other tools").
TOP_TOOLS = 8
#: The waiting gauge counts at most this many rows.
GAUGE_COUNT_CAP = 100_000
#: How long the day's figures are reused (its buckets are 15 minutes long).
DAY_CACHE_SECONDS = 120
#: ``work_mem`` for the figures' statements (Postgres): a day's durations sort in memory.
SORT_MEMORY = "64MB"


@dataclass(frozen=True)
class Window:
    """``buckets`` consecutive spans of ``step``, the last holding ``now``."""

    name: str
    start: datetime
    step: timedelta
    buckets: int

    @property
    def end(self) -> datetime:
        return self.start + self.step * self.buckets

    def bucket_starts(self) -> list[datetime]:
        return [self.start + self.step * i for i in range(self.buckets)]

    def bucket_of(self, at: datetime) -> int:
        return int((at - self.start) // self.step)


def window(name: str, now: datetime, step: timedelta, buckets: int) -> Window:
    """The window of ``buckets`` steps aligned on whole steps since the epoch,
    whose last bucket holds ``now``."""
    epoch = datetime(1970, 1, 1, tzinfo=now.tzinfo)
    last = epoch + step * ((now - epoch) // step)
    return Window(name=name, start=last - step * (buckets - 1), step=step, buckets=buckets)


def last_hour(now: datetime) -> Window:
    return window("hour", now, timedelta(minutes=1), 60)


def last_day(now: datetime) -> Window:
    return window("day", now, timedelta(minutes=15), 96)


@dataclass(frozen=True)
class Percentiles:
    """p50 and p95 in seconds of ``count`` durations (``None`` when none)."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None


@dataclass(frozen=True)
class Gauges:
    """Active tasks now. ``working`` includes runs still queued;
    ``input_required_capped``: more than ``GAUGE_COUNT_CAP`` wait (then
    ``working`` is an upper bound)."""

    working: int
    input_required: int
    input_required_capped: bool = False


@dataclass(frozen=True)
class WindowFigures:
    window: Window
    #: status -> tasks created per bucket (``CREATED_STATUSES``).
    created: dict[str, list[int]]
    #: terminal status -> tasks finished per bucket.
    finished: dict[str, list[int]]
    run_time: list[Percentiles]
    queue_wait: list[Percentiles]
    run_time_overall: Percentiles
    queue_wait_overall: Percentiles
    #: (tool, failures), most first, then by name; at most ``TOP_TOOLS``.
    failures_by_tool: list[tuple[str, int]]
    #: Failures of the tools past ``TOP_TOOLS``.
    failures_other: int = 0
    failures_total: int = 0
    #: (tool, tool errors), as ``failures_by_tool``; then the rest and the total.
    tool_errors_by_tool: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    tool_errors_other: int = 0
    tool_errors_total: int = 0
    #: When they were computed (a cached window's may be older than the page).
    computed_at: datetime | None = None
    #: (queue, queue wait over the window) for each queue runs went to, by name.
    queue_wait_by_queue: list[tuple[str, Percentiles]] = field(default_factory=list)


@dataclass(frozen=True)
class Overview:
    at: datetime
    gauges: Gauges
    windows: tuple[WindowFigures, ...]


def overview(now: datetime | None = None) -> Overview:
    """The whole page's figures at ``now``: the gauges and the hour, fresh;
    the day, as computed within the last ``DAY_CACHE_SECONDS``."""
    now = now or timezone.now()
    return Overview(
        at=now,
        gauges=gauges(),
        windows=(figures(last_hour(now), now), cached_figures(last_day(now), now, DAY_CACHE_SECONDS)),
    )


def cached_figures(win: Window, now: datetime, max_age: float) -> WindowFigures:
    """``figures``, kept in the default Django cache for ``max_age`` seconds.
    The day reads some hundred thousand rows on a busy server; an operator
    reloading the page, or several looking at once, pays for it once."""
    key = f"mcptasks:overview:{win.name}:{win.start.timestamp():.0f}:{win.step.total_seconds():.0f}"
    kept = caches["default"].get(key)
    if isinstance(kept, WindowFigures):
        return kept
    fresh = figures(win, now)
    caches["default"].set(key, fresh, max_age)
    return fresh


def gauges() -> Gauges:
    """Working and waiting tasks, without counting the table.

    The active total is the sum of the per-owner counter's slots (a few rows
    per owner). The waiting tasks are counted on ``mcptasks_status_created``,
    which reaches them alone, capped at ``GAUGE_COUNT_CAP``. One statement,
    so both come from one snapshot."""
    if on_postgres():
        cursor = sql.execute(
            "overview_gauges", {"input_required": TaskStatus.INPUT_REQUIRED.value, "cap": GAUGE_COUNT_CAP + 1}
        )
        active, waiting = cursor.fetchone()
    else:
        active = ActiveTaskCount.objects.aggregate(n=Sum("active"))["n"] or 0
        waiting = Task.objects.filter(status=TaskStatus.INPUT_REQUIRED).order_by()[: GAUGE_COUNT_CAP + 1].count()
    capped = waiting > GAUGE_COUNT_CAP
    waiting = min(int(waiting), GAUGE_COUNT_CAP)
    return Gauges(working=max(int(active) - waiting, 0), input_required=waiting, input_required_capped=capped)


def figures(win: Window, now: datetime) -> WindowFigures:
    """Every figure of one window."""
    if on_postgres():
        with transaction.atomic():
            sql.execute("overview_settings", {"work_mem": SORT_MEMORY})
            return _figures_sql(win, now)
    return _figures_rows(win, now)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` percentile of sorted ``values``, interpolated between
    the two nearest ranks, as Postgres's ``percentile_cont``."""
    position = fraction * (len(values) - 1)
    low = math.floor(position)
    high = math.ceil(position)
    return values[low] + (values[high] - values[low]) * (position - low)


def percentiles(values: Iterable[float]) -> Percentiles:
    ordered = sorted(values)
    if not ordered:
        return Percentiles()
    return Percentiles(count=len(ordered), p50=percentile(ordered, 0.5), p95=percentile(ordered, 0.95))


def _top_tools(counts: dict[str, int]) -> tuple[list[tuple[str, int]], int, int]:
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:TOP_TOOLS], sum(n for _, n in ranked[TOP_TOOLS:]), sum(counts.values())


# Postgres: one grouped scan of each window ----------------------------------------------


def _figures_sql(win: Window, now: datetime) -> WindowFigures:
    """Two scans, each of one window of one index: the creations (counts by
    status, queue waits) and the finishes (counts by status, run times), plus
    the failures by tool, which the finished index and the status index
    narrow together."""
    span = {"start": win.start, "end": win.end}
    statuses = {str(status): str(status) for status in CREATED_STATUSES}
    scan = {**span, **statuses, "step": win.step.total_seconds()}
    created, queue_wait, queue_wait_overall = _scan_sql(
        "overview_created", {**scan, "now": now}, statuses=CREATED_STATUSES, buckets=win.buckets
    )
    finished, run_time, run_time_overall = _scan_sql(
        "overview_finished", scan, statuses=TERMINAL_STATUSES, buckets=win.buckets
    )
    failures: dict[str, int] = {}
    tool_errors: dict[str, int] = {}
    for tool_name, failed, errored in sql.execute(
        "overview_failures", {**span, "failed": TaskStatus.FAILED.value}
    ).fetchall():
        if failed:
            failures[tool_name] = failed
        if errored:
            tool_errors[tool_name] = errored
    top, other, total = _top_tools(failures)
    errors_top, errors_other, errors_total = _top_tools(tool_errors)
    tools, default = _routes()
    by_queue = [
        (queue, Percentiles(count=timed, p50=quantiles[0], p95=quantiles[1]) if timed else Percentiles())
        for queue, timed, quantiles in sql.execute(
            "overview_queue_wait",
            {**span, "now": now, "tools": list(tools), "queues": list(tools.values()), "default": default},
        ).fetchall()
    ]
    return WindowFigures(
        window=win,
        created=created,
        finished=finished,
        run_time=run_time,
        queue_wait=queue_wait,
        run_time_overall=run_time_overall,
        queue_wait_overall=queue_wait_overall,
        failures_by_tool=top,
        failures_other=other,
        failures_total=total,
        tool_errors_by_tool=errors_top,
        tool_errors_other=errors_other,
        tool_errors_total=errors_total,
        computed_at=now,
        queue_wait_by_queue=by_queue,
    )


def _routes() -> tuple[dict[str, str], str]:
    """Each known tool's queue (the registry's and ``TOOL_CONTROLS``'), and
    the name of the queue of any other tool (``CELERY_QUEUE``, else Celery's
    default queue, shown as "(default)")."""
    default = settings.CELERY_QUEUE or DEFAULT_QUEUE_LABEL
    names = [t.name for t in registry.all()] + list(settings.TOOL_CONTROLS)
    return {name: effective.queue_for(name) or default for name in names}, default


def _scan_sql(
    name: str, params: dict[str, Any], *, statuses: Sequence[str], buckets: int
) -> tuple[dict[str, list[int]], list[Percentiles], Percentiles]:
    """The statement ``name``'s rows: per bucket, the count by status (in the
    order of ``statuses``) and p50/p95 of a duration (null durations
    skipped), and the percentiles over the whole window (``GROUPING SETS``:
    its row has a null bucket)."""
    by_status = {status: [0] * buckets for status in statuses}
    per_bucket = [Percentiles()] * buckets
    overall = Percentiles()
    for row in sql.execute(name, params).fetchall():
        index, timed, quantiles = row[0], row[-2], row[-1]
        figures = Percentiles(count=timed, p50=quantiles[0], p95=quantiles[1]) if timed else Percentiles()
        if index is None:
            overall = figures
            continue
        per_bucket[index] = figures
        for status, n in zip(statuses, row[1:-2], strict=True):
            by_status[status][index] = n
    return by_status, per_bucket, overall


# Other databases: the window's rows, grouped here --------------------------------------


def _figures_rows(win: Window, now: datetime) -> WindowFigures:
    created = {status: [0] * win.buckets for status in CREATED_STATUSES}
    finished: dict[str, list[int]] = {status: [0] * win.buckets for status in TERMINAL_STATUSES}
    waits: list[list[float]] = [[] for _ in range(win.buckets)]
    runs: list[list[float]] = [[] for _ in range(win.buckets)]
    failures: dict[str, int] = {}
    tool_errors: dict[str, int] = {}

    routes, default = _routes()
    by_queue: dict[str, list[float]] = {}
    made = Task.objects.filter(created_at__gte=win.start, created_at__lt=win.end).order_by()
    for created_at, status, started_at, finished_at, tool_name in made.values_list(
        "created_at", "status", "started_at", "finished_at", "tool_name"
    ).iterator():
        bucket = win.bucket_of(created_at)
        created[status][bucket] += 1
        wait = ((started_at or finished_at or now) - created_at).total_seconds()
        waits[bucket].append(wait)
        by_queue.setdefault(routes.get(tool_name, default), []).append(wait)

    ended = Task.objects.filter(finished_at__gte=win.start, finished_at__lt=win.end).order_by()
    for finished_at, status, started_at, tool_name, tool_error in ended.values_list(
        "finished_at", "status", "started_at", "tool_name", "tool_error"
    ).iterator():
        assert finished_at is not None  # the filter asks for a finish time
        bucket = win.bucket_of(finished_at)
        finished[status][bucket] += 1
        if started_at is not None:
            runs[bucket].append((finished_at - started_at).total_seconds())
        if tool_error:
            tool_errors[tool_name] = tool_errors.get(tool_name, 0) + 1
        elif status == TaskStatus.FAILED:
            failures[tool_name] = failures.get(tool_name, 0) + 1

    top, other, total = _top_tools(failures)
    errors_top, errors_other, errors_total = _top_tools(tool_errors)
    return WindowFigures(
        window=win,
        created=created,
        finished=finished,
        run_time=[percentiles(values) for values in runs],
        queue_wait=[percentiles(values) for values in waits],
        run_time_overall=percentiles(v for values in runs for v in values),
        queue_wait_overall=percentiles(v for values in waits for v in values),
        failures_by_tool=top,
        failures_other=other,
        failures_total=total,
        tool_errors_by_tool=errors_top,
        tool_errors_other=errors_other,
        tool_errors_total=errors_total,
        computed_at=now,
        queue_wait_by_queue=[(queue, percentiles(values)) for queue, values in sorted(by_queue.items())],
    )
