"""What the task admin shows beside the model's own fields: times to the
second (or millisecond) and the outcome filter that tells tool errors from
successes (``mcptasks.admin``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from .models import TaskStatus


def precise_time(value: Any, *, milliseconds: bool = False) -> str:
    """``2026-11-22 14:05:09`` (or ``14:05:09.123`` with ``milliseconds``) in
    the current time zone, with the full value on hover."""
    if value is None:
        return "-"
    local = timezone.localtime(value)
    shown = local.strftime("%Y-%m-%d %H:%M:%S")
    if milliseconds:
        shown += f".{local.microsecond // 1000:03d}"
    return format_html('<span title="{}">{}</span>', local.isoformat(), shown)


class OutcomeFilter(admin.SimpleListFilter):
    """Tool errors apart from successes: a finished task whose tool returned
    an ``isError`` result is ``completed`` on the 2026-07-28 wire. Each choice
    reads an index (``mcptasks_tool_error_created``, ``mcptasks_status_created``)."""

    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("tool_error", "tool error"), ("success", "completed, no tool error")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "tool_error":
            return queryset.filter(tool_error=True)
        if self.value() == "success":
            return queryset.filter(status=TaskStatus.COMPLETED, tool_error=False)
        return queryset
