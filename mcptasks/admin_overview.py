"""The admin's overview page (Admin > MCP tasks > Overview): what is working
and waiting now, and the last hour and day of creations, finishes, run
times, queue waits and failures, drawn as inline SVG on the server.

Staff only, through the admin site's own login check; the user also needs
the permission to view tasks. The figures come from
``mcptasks.tasks.overview``; this module only lays them out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from . import admin_charts
from .admin_charts import Chart, Series
from .models import TERMINAL_STATUSES, TaskStatus
from .tasks import lifecycle, overview
from .tools import effective
from .tools.registry import registry

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: The admin's status colours (``mcptasks/admin.css``), for the charts.
STATUS_COLORS = {
    TaskStatus.WORKING: "#1f6feb",
    TaskStatus.INPUT_REQUIRED: "#9a6700",
    TaskStatus.COMPLETED: "#1a7f37",
    TaskStatus.FAILED: "#cf222e",
    TaskStatus.CANCELLED: "#8c959f",
}
P50_COLOR = "#1f6feb"
P95_COLOR = "#bc4c00"
RATE_UNIT = timedelta(minutes=1)
WINDOW_TITLES = {"hour": "The last hour", "day": "The last day"}


@dataclass(frozen=True)
class FailureBar:
    tool: str
    count: int
    #: Share of the longest bar, in percent (the bar's width).
    width: float


@dataclass(frozen=True)
class WindowPage:
    name: str
    title: str
    bucket: str
    created_total: int
    finished_total: int
    charts: list[Chart]
    failures: list[FailureBar]
    failures_other: int
    failures_total: int
    tool_errors: list[FailureBar]
    tool_errors_other: int
    tool_errors_total: int
    computed_at: datetime | None
    #: (queue, runs timed, p50 s, p95 s) of the window's queue waits, by queue.
    queue_waits: list[tuple[str, int, float | None, float | None]] = field(default_factory=list)


def describe_controls(tool_name: str) -> str:
    """A tool's execution controls in a line (its own with the site's), for operators."""
    controls = effective.controls_for(tool_name)
    parts = [f"queue {effective.queue_for(tool_name) or 'default'}"]
    if controls.soft_time_limit:
        parts.append(f"soft limit {controls.soft_time_limit:g} s")
    if controls.time_limit:
        parts.append(f"limit {controls.time_limit:g} s")
    if controls.retries:
        on = ", ".join(c.__name__ for c in controls.retry_on)
        parts.append(
            f"{controls.retries} retries on {on} (backoff {controls.retry_backoff:g} s, "
            f"at most {controls.retry_backoff_max:g} s)"
        )
    if controls.concurrency:
        parts.append(f"at most {controls.concurrency} at once ({lifecycle.slots_held(tool_name)} running)")
    return "; ".join(parts)


def overview_urls(model_admin: ModelAdmin[Any]) -> list[URLPattern]:
    """The page's URL, under the task admin's (``admin:mcptasks_task_overview``)."""

    def view(request: HttpRequest) -> HttpResponse:
        return overview_view(request, model_admin)

    return [path("overview/", model_admin.admin_site.admin_view(view), name="mcptasks_task_overview")]


class OverviewEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # generic only in the stubs
    """The overview's entry on the admin index (the ``TaskOverview`` proxy):
    shown to whoever may view tasks, it leads to the page and does nothing else."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("mcptasks.view_task")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("mcptasks.view_task")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name=f"{opts.app_label}_{opts.model_name}_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:mcptasks_task_overview"))


def overview_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    began = time.perf_counter()
    figures = overview.overview()
    elapsed_ms = (time.perf_counter() - began) * 1000
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Overview",
        "subtitle": None,
        "opts": opts,
        "app_label": opts.app_label,
        "at": figures.at,
        "gauges": figures.gauges,
        "windows": [_window_page(w) for w in figures.windows],
        "elapsed_ms": elapsed_ms,
        "tools": [(tool.name, describe_controls(tool.name)) for tool in registry.all() if tool.task != "never"],
    }
    return TemplateResponse(request, "admin/mcptasks/overview.html", context)


def _window_page(figures: overview.WindowFigures) -> WindowPage:
    win = figures.window
    starts = win.bucket_starts()
    minutes = int(win.step / RATE_UNIT)
    rate = "per minute" if minutes == 1 else f"per minute (mean of {minutes}-minute buckets)"
    created = admin_charts.stacked_bars(
        f"Created {rate}, by status now",
        starts,
        win.step,
        [Series(_name(status), STATUS_COLORS[status], figures.created[status]) for status in _statuses()],
        per=RATE_UNIT,
    )
    finished = admin_charts.stacked_bars(
        f"Finished {rate}, by outcome",
        starts,
        win.step,
        [Series(_name(status), STATUS_COLORS[status], figures.finished[status]) for status in _terminal()],
        per=RATE_UNIT,
    )
    charts = [
        created,
        finished,
        _percentile_chart("Run time: first start to finish", win, figures.run_time, figures.run_time_overall),
        _percentile_chart("Queue wait: creation to first start", win, figures.queue_wait, figures.queue_wait_overall),
    ]
    longest = max((n for _, n in (*figures.failures_by_tool, *figures.tool_errors_by_tool)), default=0)
    return WindowPage(
        name=win.name,
        title=WINDOW_TITLES.get(win.name, win.name),
        bucket=f"{minutes}-minute buckets",
        created_total=sum(sum(series) for series in figures.created.values()),
        finished_total=sum(sum(series) for series in figures.finished.values()),
        charts=charts,
        failures=[FailureBar(tool, n, 100.0 * n / longest) for tool, n in figures.failures_by_tool],
        failures_other=figures.failures_other,
        failures_total=figures.failures_total,
        tool_errors=[FailureBar(tool, n, 100.0 * n / longest) for tool, n in figures.tool_errors_by_tool],
        tool_errors_other=figures.tool_errors_other,
        tool_errors_total=figures.tool_errors_total,
        computed_at=figures.computed_at,
        queue_waits=[(queue, p.count, p.p50, p.p95) for queue, p in figures.queue_wait_by_queue],
    )


def _percentile_chart(
    title: str, win: overview.Window, per_bucket: list[overview.Percentiles], overall: overview.Percentiles
) -> Chart:
    def summary(value: float | None) -> str:
        if value is None:
            return "no tasks"
        return f"{admin_charts.format_seconds(value)} over {overall.count:,} tasks"

    return admin_charts.lines(
        title,
        win.bucket_starts(),
        win.step,
        [
            Series("p50", P50_COLOR, [p.p50 for p in per_bucket]),
            Series("p95", P95_COLOR, [p.p95 for p in per_bucket]),
        ],
        [summary(overall.p50), summary(overall.p95)],
    )


def _statuses() -> list[TaskStatus]:
    return [TaskStatus(s) for s in overview.CREATED_STATUSES]


def _terminal() -> list[TaskStatus]:
    return [TaskStatus(s) for s in TERMINAL_STATUSES]


def _name(status: TaskStatus) -> str:
    """As the status badges write it: ``input required``."""
    return str(status.value).replace("_", " ")
