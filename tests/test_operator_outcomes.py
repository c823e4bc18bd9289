"""What operators see of a task (issue 29): a tool's error result is no
success anywhere but on the wire (the row's ``tool_error`` marker, the admin
list's badge and filter, the overview's failures, the run span, the task
counters' outcome label), times to the second (milliseconds in the
timeline), the overview's entry on the site's admin index, and the run
queue's depth gauge at 0 when the Redis queue is empty."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from opentelemetry.trace import StatusCode

from mcptasks.admin import change_url
from mcptasks.models import Era, Task, TaskStatus
from mcptasks.protocol import eras
from mcptasks.tasks import lifecycle, overview
from mcptasks.telemetry import runs
from mcptasks.worker import execution, queue_depth
from tests.support import postgres_only
from tests.support.factories import WORKER, completed_task, failed_task, running_task
from tests.support.otel import Recorder, fresh

TOOL_ERROR_RESULT = {"content": [{"type": "text", "text": "the tool said no"}], "isError": True}
CHANGELIST = reverse("admin:mcptasks_task_changelist")


@pytest.fixture
def otel() -> Iterator[Recorder]:
    yield from fresh()


def _finish(era: str, result: dict[str, Any]) -> Task:
    task = running_task(era=era)
    assert lifecycle.finish_run(task.id, result, worker=WORKER, to=eras.status_after_result(era, result))
    return Task.objects.get(pk=task.id)


@pytest.mark.django_db
def test_the_finishing_write_marks_a_tool_error_in_either_era() -> None:
    """The same statement (Postgres) or its ORM twin (elsewhere) that
    finishes the task marks it; the wire's status stays the era's."""
    modern = _finish(Era.MODERN, TOOL_ERROR_RESULT)
    legacy = _finish(Era.LEGACY, TOOL_ERROR_RESULT)
    ok = _finish(Era.MODERN, {"content": [], "isError": False})
    assert (modern.status, modern.tool_error, modern.result) == (TaskStatus.COMPLETED, True, TOOL_ERROR_RESULT)
    assert (legacy.status, legacy.tool_error) == (TaskStatus.FAILED, True)
    assert (ok.status, ok.tool_error) == (TaskStatus.COMPLETED, False)
    assert failed_task().tool_error is False  # a protocol failure is no tool error


@pytest.mark.django_db
def test_the_task_list_shows_and_filters_tool_errors(admin_client: Any) -> None:
    errored = _finish(Era.MODERN, TOOL_ERROR_RESULT)
    done = completed_task()
    failed = failed_task()

    html = admin_client.get(CHANGELIST).content.decode()
    assert '<span class="mcptasks-badge mcptasks-completed mcptasks-tool_error">completed · tool error</span>' in html
    assert html.count("· tool error</span>") == 1

    def listed(query: str) -> set[str]:
        page = admin_client.get(f"{CHANGELIST}?{query}").content.decode()
        return set(re.findall(r'<code title="([^"]+)">', page))

    assert listed("outcome=tool_error") == {errored.id}
    assert listed("outcome=success") == {done.id}
    assert listed("status__exact=failed") == {failed.id}
    assert listed("") == {errored.id, done.id, failed.id}


@postgres_only.PLANNER
@pytest.mark.django_db
def test_the_tool_error_filter_reads_its_index() -> None:
    qs = Task.objects.filter(tool_error=True).order_by("-created_at", "-id")[:50]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = qs.explain()
    assert "mcptasks_tool_error_created" in plan, plan


@pytest.mark.django_db
def test_the_overview_counts_tool_errors_apart_from_protocol_failures(admin_client: Any) -> None:
    _finish(Era.MODERN, TOOL_ERROR_RESULT)
    _finish(Era.LEGACY, TOOL_ERROR_RESULT)
    failed_task(tool="greet")
    completed_task()
    now = timezone.now()
    figures = overview.figures(overview.last_hour(now), now)
    assert figures.failures_by_tool == [("greet", 1)]
    assert figures.tool_errors_by_tool == [("slow_compute", 2)]
    assert (figures.failures_total, figures.tool_errors_total) == (1, 2)
    html = admin_client.get(reverse("admin:mcptasks_task_overview")).content.decode()
    assert "3 in all: 1 failed, 2 tool errors" in html
    assert f"{CHANGELIST}?outcome=tool_error&amp;tool=slow_compute" in html


@pytest.mark.django_db(transaction=True)
def test_a_tool_error_run_is_an_error_in_its_span_and_counted_with_its_outcome(rpc: Any, otel: Recorder) -> None:
    def counted(metric: str, tool: str, outcome: str) -> float:
        return otel.total(metric, **{"gen_ai.tool.name": tool, "mcptasks.task.outcome": outcome})

    before = {
        "tool_error": counted("mcptasks.task.completed", "failing_job", "tool_error"),
        "success": counted("mcptasks.task.completed", "failing_job", "success"),
        "slow": counted("mcptasks.task.completed", "slow_compute", "success"),
        "error": counted("mcptasks.task.failed", "protocol_error_job", "error"),
    }
    task_id = rpc.call_tool("failing_job").result["taskId"]
    assert runs.traced(execution.run_task, task_id) == "tool_error"
    # The wire keeps the 2026-07-28 rule: completed, with the isError result.
    assert rpc.tasks_get(task_id).result["status"] == "completed"
    spans = otel.named("execute_tool failing_job")
    assert len(spans) == 1
    span = spans[0]
    assert span.attributes["error.type"] == "tool_error"
    assert span.attributes["mcptasks.run.outcome"] == "tool_error"
    assert span.status.status_code == StatusCode.ERROR
    assert counted("mcptasks.task.completed", "failing_job", "tool_error") - before["tool_error"] == 1
    assert counted("mcptasks.task.completed", "failing_job", "success") == before["success"]
    # A clean run is a success, a protocol failure an error.
    done = rpc.call_tool("slow_compute", {"seconds": 0, "label": "ok"}).result["taskId"]
    assert runs.traced(execution.run_task, done) == "completed"
    assert counted("mcptasks.task.completed", "slow_compute", "success") - before["slow"] == 1
    broken = rpc.call_tool("protocol_error_job").result["taskId"]
    assert runs.traced(execution.run_task, broken) == "failed"
    assert counted("mcptasks.task.failed", "protocol_error_job", "error") - before["error"] == 1


@pytest.mark.django_db
def test_a_task_s_page_shows_seconds_and_its_timeline_milliseconds(admin_client: Any) -> None:
    task = running_task()
    at = timezone.localtime(task.created_at)
    html = admin_client.get(change_url(task.id)).content.decode()
    fields = {
        name: re.search(rf'field-{name}">.*?<div class="readonly">(.*?)</div>', html, re.S)
        for name in ("created", "started", "lease_expires")
    }
    for name, match in fields.items():
        assert match is not None, name
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d<", match.group(1)), (name, match.group(1))
    assert at.strftime("%Y-%m-%d %H:%M:%S") in html
    lease = timezone.localtime(Task.objects.get(pk=task.id).lease_expires_at)
    assert lease.strftime("%H:%M:%S") in html
    # The timeline: each event to the millisecond, and no caption row repeating it.
    stamps = re.findall(r'<td class="field-at_ms">\s*<p><span title="[^"]+">([^<]+)</span>', html)
    assert len(stamps) == 2, stamps  # created, run_started
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", s) for s in stamps), stamps
    # The caption of each row (its text again) is hidden by the inline's class (mcptasks/admin.css).
    assert re.search(r'<fieldset class="module[^"]*mcptasks-readonly-inline', html)


@pytest.mark.django_db
def test_the_site_s_admin_index_lists_the_overview(admin_client: Any, client: Any, django_user_model: Any) -> None:
    entry = reverse("admin:mcptasks_taskoverview_changelist")
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert f'<a href="{entry}">Overview</a>' in index
    followed = admin_client.get(entry)
    assert followed.status_code == 302 and followed["Location"] == reverse("admin:mcptasks_task_overview")
    # Staff who may not view tasks are not offered it.
    client.force_login(django_user_model.objects.create_user("ops", password="pw", is_staff=True))
    assert entry not in client.get(reverse("admin:index")).content.decode()
    assert client.get(entry).status_code in (302, 403)


@pytest.mark.redis
def test_the_queue_depth_gauge_reports_zero_for_an_empty_redis_queue(settings: Any) -> None:
    from celery import current_app

    url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    queue = f"mcptasks-depth-{uuid.uuid4().hex[:8]}"
    settings.MCPTASKS = {**settings.MCPTASKS, "CELERY_QUEUE": queue}
    before = current_app.conf.broker_read_url
    current_app.conf.broker_read_url = url
    try:
        readings = {o.attributes["messaging.destination.name"]: o.value for o in queue_depth.depths()}
    finally:
        current_app.conf.broker_read_url = before
    assert readings[queue] == 0


def test_times_have_seconds_even_a_second_apart() -> None:
    from mcptasks.admin_display import precise_time

    at = timezone.now().replace(microsecond=123456)
    assert precise_time(at).endswith(f"{timezone.localtime(at):%H:%M:%S}</span>")
    assert precise_time(at, milliseconds=True).endswith(f"{timezone.localtime(at):%H:%M:%S}.123</span>")
    assert precise_time(at + timedelta(seconds=1)) != precise_time(at)
    assert precise_time(None) == "-"
