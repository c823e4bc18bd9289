"""The admin's overview page: staff with the view permission only, linked
from the site's and the app's admin index and the task list, drawn as inline SVG with no
script, and its queries bounded (a fixed number, whatever the table holds)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import caches
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from mcptasks import admin_charts
from tests.support.factories import completed_task, failed_task, make_task, running_task, waiting_task

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_day_figures() -> Any:
    """The day's figures are cached for a while: each test starts without them."""
    caches["default"].clear()
    yield
    caches["default"].clear()


OVERVIEW = reverse("admin:mcptasks_task_overview")


def test_the_overview_lives_under_the_task_admin():
    assert OVERVIEW == "/admin/mcptasks/task/overview/"


def test_anonymous_visitors_are_sent_to_the_login(client: Any):
    response = client.get(OVERVIEW)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_users_who_are_not_staff_are_refused(client: Any, django_user_model: Any):
    user = django_user_model.objects.create_user("visitor", password="pw")
    user.user_permissions.add(Permission.objects.get(content_type__app_label="mcptasks", codename="view_task"))
    client.force_login(user)
    response = client.get(OVERVIEW)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert b"<svg" not in response.content


def test_staff_without_the_view_permission_are_forbidden(client: Any, django_user_model: Any):
    client.force_login(django_user_model.objects.create_user("ops", password="pw", is_staff=True))
    assert client.get(OVERVIEW).status_code == 403
    # Nor is the page offered to them.
    assert reverse("admin:mcptasks_task_overview").encode() not in client.get("/admin/mcptasks/").content
    assert reverse("admin:mcptasks_taskoverview_changelist").encode() not in client.get("/admin/").content


def test_staff_with_the_view_permission_see_it(client: Any, django_user_model: Any):
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="mcptasks", codename="view_task"))
    client.force_login(user)
    assert client.get(OVERVIEW).status_code == 200


def test_the_page_shows_the_gauges_charts_and_failures(admin_client: Any):
    running_task()
    make_task()
    waiting_task()
    completed_task()
    failed_task(tool="flaky")
    failed_task(tool="flaky")
    failed_task(tool="broken")

    response = admin_client.get(OVERVIEW)

    assert response.status_code == 200
    html = response.content.decode()
    page = html[html.index('id="content-main"') : html.index("<!-- END Content -->")]
    assert "<script" not in page  # drawn on the server
    assert re.search(r'id="gauge-working">\s*<span class="mcptasks-gauge-value">2</span>', html)
    assert re.search(r'id="gauge-input-required">\s*<span class="mcptasks-gauge-value">1</span>', html)
    # Two windows, each with four charts and its failures.
    assert 'id="window-hour"' in html and 'id="window-day"' in html
    assert page.count('<svg viewBox="0 0 600 190" role="img"') == 8
    assert "Created per minute, by status now" in html
    assert "Finished per minute (mean of 15-minute buckets), by outcome" in html
    assert "Queue wait: creation to first start" in html
    hour = html[html.index('id="window-hour"') : html.index('id="window-day"')]
    finished = hour[hour.index("Finished per minute") : hour.index("Run time")]

    def bars(status: str) -> int:
        """The tasks the bars of ``status`` hold (a minute may turn meanwhile)."""
        return sum(int(n) for n in re.findall(rf"<title>\d\d:\d\d: (\d+) {status}</title>", finished))

    assert (bars("completed"), bars("failed"), bars("cancelled")) == (1, 3, 0)
    failures = re.findall(r'tool=(\w+)">\w+</a></th>.*?mcptasks-failure-count">(\d+)<', hour, re.S)
    assert failures == [("flaky", "2"), ("broken", "1")]
    assert "7 created, 4 finished" in hour
    # The admin's look: its base template, breadcrumbs and the app's stylesheet.
    assert '<div class="breadcrumbs">' in html and "mcptasks/admin.css" in html
    assert 'id="site-name"' in html


def test_the_page_runs_a_fixed_number_of_queries(admin_client: Any):
    admin_client.get(OVERVIEW)  # session and user rows warm
    with CaptureQueriesContext(connection) as first:
        admin_client.get(OVERVIEW)
    for _ in range(5):
        completed_task()
        failed_task()
    with CaptureQueriesContext(connection) as second:
        admin_client.get(OVERVIEW)
    assert len(first) == len(second)


def test_the_app_index_and_the_task_list_link_to_it(admin_client: Any):
    # The app's index lists the overview's entry (as the site's index does), which leads to the page.
    entry = reverse("admin:mcptasks_taskoverview_changelist")
    index = admin_client.get("/admin/mcptasks/").content.decode()
    assert f'<a href="{entry}">Overview</a>' in index
    assert admin_client.get(entry)["Location"] == OVERVIEW
    changelist = admin_client.get(reverse("admin:mcptasks_task_changelist")).content.decode()
    assert f'<a href="{OVERVIEW}">Overview</a>' in changelist


def test_an_empty_window_says_so(admin_client: Any):
    html = admin_client.get(OVERVIEW).content.decode()
    assert html.count("No tasks in this window") == 8
    assert html.count("No failures.") == 2


def test_axis_steps_are_round_numbers():
    at = timezone.now()
    starts = [at + timedelta(minutes=i) for i in range(3)]
    step = timedelta(minutes=1)
    times = admin_charts.lines("t", starts, step, [admin_charts.Series("p95", "#000", [48.0, None, 3.0])], ["x"])
    assert [t.label for t in times.y_ticks] == ["0", "10 s", "20 s", "30 s", "40 s", "50 s"]
    counts = admin_charts.stacked_bars("c", starts, step, [admin_charts.Series("done", "#000", [13, 0, 2])])
    assert [t.label for t in counts.y_ticks] == ["0", "5", "10", "15", "20"]
    # A gap breaks the line: two runs of one point each.
    assert len(times.lines[0].paths) == 2 and len(times.lines[0].dots) == 2
    assert [admin_charts.nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 11, 180, 999)] == [1, 0.5, 1, 5, 10, 20, 200, 1000]
    assert [admin_charts.format_seconds(s) for s in (0, 0.25, 4.25, 8, 42, 210, 7200)] == [
        "0",
        "250 ms",
        "4.2 s",
        "8 s",
        "42 s",
        "3.5 min",
        "2.0 h",
    ]


def test_the_day_is_reused_for_a_while_and_the_hour_is_not(admin_client: Any):
    admin_client.get(OVERVIEW)
    completed_task()
    html = admin_client.get(OVERVIEW).content.decode()
    hour = html[html.index('id="window-hour"') : html.index('id="window-day"')]
    day = html[html.index('id="window-day"') :]
    assert "1 created, 1 finished" in hour
    assert "0 created, 0 finished; as of " in day
    caches["default"].clear()
    day = admin_client.get(OVERVIEW).content.decode().split('id="window-day"', 1)[1]
    assert "1 created, 1 finished" in day


def test_the_overview_lists_each_task_tools_controls_and_queue_waits_by_queue(admin_client: Any, settings: Any):
    settings.MCPTASKS = {
        **settings.MCPTASKS,
        "CELERY_QUEUE": "runs",
        "TOOL_CONTROLS": {"slow_compute": {"queue": "slow", "time_limit": 90, "concurrency": 3}},
    }
    make_task(tool="slow_compute")
    make_task(tool="failing_job")
    page = admin_client.get(OVERVIEW).content.decode()
    assert "queue slow; limit 90 s; at most 3 at once (0 running)" in page
    assert "queue runs" in page  # the other task tools, on the site's run queue
    assert "Queue wait by queue" in page
    assert re.search(r"<th scope=\"row\">slow</th><td>1</td>", page)
    assert re.search(r"<th scope=\"row\">runs</th><td>1</td>", page)
