"""What the task admin shows beside the model's own fields: times to the
second (or millisecond), JSON, status badges, and the list filters (the
tools from the registry, the outcome that tells tool errors from
successes) (``mcptasks.admin``)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from .models import TaskStatus
from .tools.registry import registry

#: Longest JSON shown on the detail page (a result may carry megabytes of
#: base64); the rest is cut with a note.
JSON_DISPLAY_LIMIT = 20_000


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


class ToolFilter(admin.SimpleListFilter):
    """Tools from the registry: no ``SELECT DISTINCT tool_name`` over the table."""

    title = "tool"
    parameter_name = "tool"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return sorted((tool.name, tool.name) for tool in registry.all())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(tool_name=value) if value else queryset


def pretty_json(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    note = ""
    if len(text) > JSON_DISPLAY_LIMIT:
        note = f"\n… ({len(text) - JSON_DISPLAY_LIMIT} more characters; see `manage.py mcptasks inspect`)"
        text = text[:JSON_DISPLAY_LIMIT]
    return format_html('<pre class="mcptasks-json">{}{}</pre>', text, note)


def short_time(value: Any) -> str:
    """``2026-11-22 14:05:09`` in the current time zone, with the full value on hover."""
    return precise_time(value)


def status_badge(status: str, tool_error: bool = False) -> str:
    """The status as a badge; a run that ended with the tool's error result
    (``Task.tool_error``) says so, whatever the era's status."""
    if tool_error:
        return format_html(
            '<span class="mcptasks-badge mcptasks-{} mcptasks-tool_error">{} · tool error</span>',
            status,
            status.replace("_", " "),
        )
    return format_html('<span class="mcptasks-badge mcptasks-{}">{}</span>', status, status.replace("_", " "))
