"""The operators' cockpit: tasks in the Django admin.

Read-only by design: nothing here edits a row. The three actions (cancel,
expire now, retry) go through ``mcptasks.tasks.lifecycle`` exactly as the wire
does, act only on rows in a legal state, report counts, and each needs its
own permission (``mcptasks.cancel_task``, ``expire_task``, ``retry_task``).

It stays fast on millions of rows: no ``COUNT(*)`` over the table (the
paginator estimates or counts up to a cap), filters that map onto the
``(status|tool_name|owner, -created_at)`` and ``(-created_at)`` indexes, a
tool filter fed by the tool registry (no ``SELECT DISTINCT``), exact-match
search, and the change list never loads the JSON columns.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from .admin_display import OutcomeFilter, ToolFilter, precise_time, pretty_json, short_time, status_badge
from .admin_overview import OverviewEntryAdmin, describe_controls, overview_urls
from .models import ACTIVE_STATUSES, TERMINAL_STATUSES, InputRequest, Task, TaskEvent, TaskOverview
from .tasks import lifecycle, sql
from .tools import effective

#: Above this many matching rows the change list says "more than N" instead
#: of counting them all.
COUNT_CAP = 10_000


# Paginator, ModelAdmin and TabularInline are generic only in django-stubs: subscripted, they fail at run time.
class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that never counts a whole large table.

    Unfiltered, it reads Postgres's row estimate (``pg_class.reltuples``,
    kept by autovacuum's ANALYZE); filtered, it counts at most
    ``COUNT_CAP + 1`` rows (``SELECT COUNT(*) FROM (... LIMIT n)``), which an
    index bounds. ``count_label`` says which it got.
    """

    #: "exact", "estimate" or "capped", once ``count`` was read.
    kind = "exact"

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if not qs.query.where:
            estimate = self._estimate(qs)
            if estimate is not None and estimate > COUNT_CAP:
                self.kind = "estimate"
                return estimate
        capped = qs.order_by()[: COUNT_CAP + 1].count()
        if capped > COUNT_CAP:
            self.kind = "capped"
        return capped

    @property
    def count_label(self) -> str:
        """The count as the page shows it."""
        count = self.count
        if self.kind == "estimate":
            return f"about {count:,}"
        if self.kind == "capped":
            return f"more than {COUNT_CAP:,}"
        return str(count)

    @staticmethod
    def _estimate(qs: QuerySet[Any]) -> int | None:
        connection = connections[qs.db]
        if connection.vendor != "postgresql":
            return None
        with connection.cursor() as cursor:
            cursor.execute(
                sql.STATEMENTS["table_size_estimate"], {"table": connection.ops.quote_name(qs.model._meta.db_table)}
            )
            row = cursor.fetchone()
        # -1: never analyzed (Postgres 14+); count it, it is small or new.
        return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


def change_url(task_id: str) -> str:
    """A task's admin page. Ids may hold "_", which the admin escapes in URLs."""
    return reverse("admin:mcptasks_task_change", args=[quote(task_id)])


class _ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]  # generic only in the stubs (above)
    # mcptasks/admin.css hides the row captions (each row's text again).
    classes = ("mcptasks-readonly-inline",)
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see the task sees its questions and its timeline.
        return request.user.has_perm("mcptasks.view_task")


class InputRequestInline(_ReadOnlyInline):
    model = InputRequest
    verbose_name = "input request"
    verbose_name_plural = "Input requests (questions to the client, with their answers)"
    fields = ("key", "method", "state", "request", "answer", "created", "answered")
    readonly_fields = fields

    @admin.display(description="created at")
    def created(self, obj: InputRequest) -> str:
        return precise_time(obj.created_at, milliseconds=True)

    @admin.display(description="answered at")
    def answered(self, obj: InputRequest) -> str:
        return precise_time(obj.answered_at, milliseconds=True)

    @admin.display(description="request")
    def request(self, obj: InputRequest) -> str:
        return pretty_json(obj.params)

    @admin.display(description="answer")
    def answer(self, obj: InputRequest) -> str:
        return pretty_json(obj.response)


class TaskEventInline(_ReadOnlyInline):
    model = TaskEvent
    verbose_name = "event"
    verbose_name_plural = "Timeline (every transition, with who caused it)"
    fields = ("at_ms", "kind", "transition", "actor", "details")
    readonly_fields = fields
    ordering = ("at", "id")

    @admin.display(description="at")
    def at_ms(self, obj: TaskEvent) -> str:
        return precise_time(obj.at, milliseconds=True)

    @admin.display(description="transition")
    def transition(self, obj: TaskEvent) -> str:
        if not obj.to_status:
            return "-"
        return f"{obj.from_status or '·'} → {obj.to_status}"

    @admin.display(description="detail")
    def details(self, obj: TaskEvent) -> str:
        if not obj.detail:
            return "-"
        linked = obj.detail.get("new_task_id") or (obj.detail.get("task_id") if obj.kind == "retry_of" else None)
        link = ""
        if linked:
            url = change_url(linked)
            link = format_html(
                '<a href="{}">{} {}</a>', url, "retried as" if obj.kind == "retried" else "retry of", linked
            )
        return format_html("{}{}", link, pretty_json(obj.detail))


#: (action name, permission codename, label on the detail page, statuses it acts on)
OBJECT_ACTIONS = (
    ("cancel_tasks", "cancel_task", "Cancel task", ACTIVE_STATUSES),
    ("expire_tasks", "expire_task", "Expire now", TERMINAL_STATUSES),
    ("retry_tasks", "retry_task", "Retry as a new task", lifecycle.RETRYABLE_STATUSES),
)


def _plural(n: int, word: str = "task") -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # generic only in the stubs (above)
    list_display = ("short_id", "tool_name", "status_badge", "owner", "era_version", "created", "updated", "expires")
    list_filter = ("status", OutcomeFilter, ToolFilter, "era", ("created_at", admin.DateFieldListFilter))
    search_fields = ("id", "tool_name", "owner")
    search_help_text = "An exact task id, tool name or owner."
    ordering = ("-created_at",)
    sortable_by = ("created",)
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = ("cancel_tasks", "expire_tasks", "retry_tasks")
    inlines = (InputRequestInline, TaskEventInline)
    fieldsets = (
        (None, {"fields": ("id", "tool_name", "status_badge", "status_message", "owner", "era")}),
        (
            "Times",
            {
                "fields": (
                    "created",
                    "started",
                    "finished",
                    "updated",
                    "expires",
                    "ttl_ms",
                    "poll_interval_ms",
                )
            },
        ),
        ("Call", {"fields": ("arguments_json", "client_capabilities_json")}),
        ("Outcome", {"fields": ("result_json", "error_json")}),
        (
            "Execution",
            {
                "fields": (
                    "queue",
                    "queue_wait",
                    "tool_attempt",
                    "tool_controls",
                    "attempts",
                    "dispatched",
                    "lease_owner",
                    "lease_expires",
                    "cancel_requested",
                    "cancelled_by",
                )
            },
        ),
    )
    readonly_fields = tuple(flatten_fieldsets(fieldsets))

    class Media:
        css = {"all": ("mcptasks/admin.css",)}

    # Read-only: rows change only through the lifecycle. ---------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Expired tasks are pruned in batches (``expire now`` + the prune).
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("mcptasks.cancel_task")

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("mcptasks.expire_task")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("mcptasks.retry_task")

    def get_urls(self) -> list[URLPattern]:
        # Before the change view's catch-all pattern.
        return overview_urls(self) + super().get_urls()

    # The change list -------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        qs = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == "mcptasks_task_changelist":
            # The list never shows the JSON columns, which may be large.
            qs = qs.defer("arguments", "client_capabilities", "result", "error")
        return qs

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        """Exact, case-sensitive matches only, each served by an index
        (the primary key, ``tool_name`` and ``owner`` lead their indexes)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(pk=term) | Q(tool_name=term) | Q(owner=term)), False

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: Task) -> str:
        return format_html('<code title="{}">{}</code>', obj.id, obj.id[:8])

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Task) -> str:
        return status_badge(obj.status, obj.tool_error)

    @admin.display(description="era")
    def era_version(self, obj: Task) -> str:
        return obj.era

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Task) -> str:
        return short_time(obj.created_at)

    @admin.display(description="updated")
    def updated(self, obj: Task) -> str:
        return short_time(obj.updated_at)

    @admin.display(description="expires")
    def expires(self, obj: Task) -> str:
        return short_time(obj.expires_at)

    # The detail page's other times, to the second as well.

    @admin.display(description="started")
    def started(self, obj: Task) -> str:
        return precise_time(obj.started_at)

    @admin.display(description="finished")
    def finished(self, obj: Task) -> str:
        return precise_time(obj.finished_at)

    @admin.display(description="dispatched")
    def dispatched(self, obj: Task) -> str:
        return precise_time(obj.dispatched_at)

    @admin.display(description="lease expires")
    def lease_expires(self, obj: Task) -> str:
        return precise_time(obj.lease_expires_at)

    @admin.display(description="cancel requested")
    def cancel_requested(self, obj: Task) -> str:
        return precise_time(obj.cancel_requested_at)

    @admin.display(description="arguments")
    def arguments_json(self, obj: Task) -> str:
        return pretty_json(obj.arguments)

    @admin.display(description="client capabilities")
    def client_capabilities_json(self, obj: Task) -> str:
        return pretty_json(obj.client_capabilities)

    @admin.display(description="result")
    def result_json(self, obj: Task) -> str:
        return pretty_json(obj.result)

    @admin.display(description="error")
    def error_json(self, obj: Task) -> str:
        return pretty_json(obj.error)

    @admin.display(description="queue")
    def queue(self, obj: Task) -> str:
        return effective.queue_for(obj.tool_name) or "(Celery's default queue)"

    @admin.display(description="queue wait")
    def queue_wait(self, obj: Task) -> str:
        """To the first run's start; for a run not started yet, so far."""
        if obj.started_at is not None:
            return f"{(obj.started_at - obj.created_at).total_seconds():.3f} s"
        if obj.status in ACTIVE_STATUSES:
            return f"{(timezone.now() - obj.created_at).total_seconds():.1f} s so far (not started)"
        return "-"

    @admin.display(description="tool attempt")
    def tool_attempt(self, obj: Task) -> str:
        """The tool's attempts (retries on its ``retry_on``), not lost runs (``attempts``)."""
        retries = lifecycle.tool_retries(obj.id)
        allowed = effective.controls_for(obj.tool_name).retries
        return f"{retries + 1} of at most {allowed + 1}" if allowed else str(retries + 1)

    @admin.display(description="tool's controls")
    def tool_controls(self, obj: Task) -> str:
        return describe_controls(obj.tool_name)

    # The detail page: the actions as buttons. ----------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = dict(extra_context or {})
        task = Task.objects.filter(pk=unquote(object_id)).only("status", "tool_name").first()
        if task is not None:
            allowed = self.get_actions(request)
            extra["mcptasks_actions"] = [
                {"name": name, "label": label}
                for name, _perm, label, statuses in OBJECT_ACTIONS
                if name in allowed
                and task.status in statuses
                and (name != "retry_tasks" or lifecycle.retry_refusal(task) is None)
            ]
            extra["mcptasks_action_checkbox"] = ACTION_CHECKBOX_NAME
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def _done(self, request: HttpRequest) -> HttpResponse | None:
        """Back to the detail page when the action was run from there."""
        back = request.POST.get("_back", "")
        if back and url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
            return HttpResponseRedirect(back)
        return None

    def _selected_count(self, request: HttpRequest) -> int | None:
        """How many rows were ticked; ``None`` for "select all" (not counted)."""
        if request.POST.get("select_across") == "1":
            return None
        return len(request.POST.getlist(ACTION_CHECKBOX_NAME))

    def _report(self, request: HttpRequest, done: int, verb: str, skipped: int | None, why: str) -> None:
        if done:
            self.message_user(request, f"{verb} {_plural(done)}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Skipped {_plural(skipped)}: {why}.", messages.WARNING)
        if not done and not skipped:
            self.message_user(request, f"No task was {verb.lower()}: {why}.", messages.WARNING)

    # The actions ----------------------------------------------------------------------------

    @admin.action(permissions=["cancel"], description="Cancel selected running or waiting tasks")
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> HttpResponse | None:
        actor = lifecycle.operator_actor(request.user.get_username())
        done = 0
        for task_id in queryset.filter(status__in=ACTIVE_STATUSES).values_list("id", flat=True).iterator():
            done += lifecycle.cancel(task_id, actor=actor, reason="Cancelled by an operator.")
        selected = self._selected_count(request)
        skipped = None if selected is None else selected - done
        self._report(request, done, "Cancelled", skipped, "only working or input_required tasks can be cancelled")
        return self._done(request)

    @admin.action(
        permissions=["expire"], description="Expire selected finished tasks now (the next prune deletes them)"
    )
    def expire_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> HttpResponse | None:
        actor = lifecycle.operator_actor(request.user.get_username())
        done = 0
        for task_id in queryset.filter(status__in=TERMINAL_STATUSES).values_list("id", flat=True).iterator():
            done += lifecycle.expire_now(task_id, actor=actor)
        selected = self._selected_count(request)
        skipped = None if selected is None else selected - done
        self._report(
            request, done, "Expired", skipped, "only finished tasks can be expired (cancel running ones first)"
        )
        return self._done(request)

    @admin.action(permissions=["retry"], description="Retry selected failed or cancelled tasks as new tasks")
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> HttpResponse | None:
        actor = lifecycle.operator_actor(request.user.get_username())
        created: list[Task] = []
        refused: Counter[str] = Counter()
        candidates = queryset.filter(status__in=lifecycle.RETRYABLE_STATUSES).only("id", "status", "tool_name")
        for task in candidates.iterator():
            why = lifecycle.retry_refusal(task)
            if why is not None:
                refused[why] += 1
                continue
            new = lifecycle.retry(task.id, actor=actor)
            if new is None:
                refused["it was retried already"] += 1
            else:
                created.append(new)
        if created:
            links = format_html_join(
                ", ",
                '<a href="{}">{}</a>',
                ((change_url(t.id), t.id[:8]) for t in created[:20]),
            )
            self.message_user(
                request, format_html("Retried {} as new tasks: {}", _plural(len(created)), links), messages.SUCCESS
            )
        selected = self._selected_count(request)
        not_eligible = None if selected is None else selected - len(created) - sum(refused.values())
        if not_eligible:
            refused["only failed or cancelled tasks can be retried"] += not_eligible
        for why, n in refused.items():
            self.message_user(request, f"Skipped {_plural(n)}: {why}.", messages.WARNING)
        if not created and not refused:
            self.message_user(request, "No task was retried: only failed or cancelled tasks can be.", messages.WARNING)
        return self._done(request)


admin.site.register(TaskOverview, OverviewEntryAdmin)
