"""The overview's figures: tasks made in known states at known times give
known counts and percentiles, on the database's own statements (Postgres) and
on the portable path that groups the rows in Python (both run here on
Postgres; the SQLite pass runs the portable one). The lifecycle stamps the
times the figures read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from mcptasks.models import Task, TaskStatus
from mcptasks.tasks import lifecycle, overview
from tests.support.factories import (
    WORKER,
    accept,
    completed_task,
    failed_task,
    make_task,
    running_task,
    waiting_task,
)

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)


def stamp(task: Task, **times: datetime | None) -> None:
    Task.objects.filter(pk=task.pk).update(**times)


@pytest.fixture(params=["database", "rows"])
def figures(request: Any) -> Any:
    """The window's figures by the path the database takes, and by the
    portable one (the same on SQLite)."""
    if request.param == "rows":
        return overview._figures_rows
    return overview.figures


# The lifecycle stamps the times ------------------------------------------------------------


def test_the_first_claim_stamps_started_at_and_later_runs_keep_it(transition_paths):
    task = waiting_task(keys=("go",))
    first = Task.objects.get(pk=task.pk).started_at
    assert first is not None and first >= task.created_at
    assert lifecycle.submit_input(task.id, {"go": accept(confirm=True)}, actor="client:alice") == ["go"]
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    again = Task.objects.get(pk=task.pk)
    assert again.attempts == 1 and again.started_at == first
    assert again.finished_at is None


def test_every_terminal_move_stamps_finished_at(transition_paths):
    done = completed_task()
    failed = failed_task()
    cancelled_queued = make_task()
    assert lifecycle.cancel(cancelled_queued.id, actor="client:alice")
    for task in (done, failed, Task.objects.get(pk=cancelled_queued.pk)):
        assert task.finished_at is not None
        assert task.finished_at == task.updated_at
    assert done.started_at is not None and done.started_at <= done.finished_at
    # Cancelled while queued: it never started.
    assert Task.objects.get(pk=cancelled_queued.pk).started_at is None
    assert running_task().finished_at is None


# The figures of one window -----------------------------------------------------------------


def test_counts_and_percentiles_of_the_last_hour(figures):
    now = timezone.now()
    hour = overview.last_hour(now)
    minute = hour.bucket_starts()

    # Ten tasks created in minute 5, which waited 1..10 s, ran 2..20 s and
    # finished in that minute too.
    for k in range(1, 11):
        task = completed_task()
        created = minute[5] + SECOND
        started = created + k * SECOND
        stamp(task, created_at=created, started_at=started, finished_at=started + 2 * k * SECOND)
    # Failures finishing in minute 10, of tasks created two hours ago.
    for tool, n in (("flaky", 3), ("broken", 1)):
        for _ in range(n):
            task = failed_task(tool=tool)
            stamp(task, created_at=now - timedelta(hours=2), started_at=minute[10], finished_at=minute[10] + SECOND)
    # Cancelled while queued, in minute 20, 30 s after its creation.
    cancelled = make_task()
    assert lifecycle.cancel(cancelled.id, actor="client:alice")
    stamp(cancelled, created_at=minute[20], finished_at=minute[20] + 30 * SECOND)
    # Still queued, created in minute 57: it has waited since.
    queued = make_task()
    stamp(queued, created_at=minute[57])
    # Waiting for input, created in minute 58, started 4 s later.
    waiting = waiting_task()
    stamp(waiting, created_at=minute[58], started_at=minute[58] + 4 * SECOND)
    # Outside the hour: created the day before, finished an hour and a half ago.
    old = completed_task()
    stamp(old, created_at=now - timedelta(days=2), started_at=now - timedelta(days=2), finished_at=now - 90 * MINUTE)

    got = figures(hour, now)

    assert got.created[TaskStatus.COMPLETED][5] == 10
    assert got.created[TaskStatus.CANCELLED][20] == 1
    assert got.created[TaskStatus.WORKING][57] == 1
    assert got.created[TaskStatus.INPUT_REQUIRED][58] == 1
    assert sum(sum(series) for series in got.created.values()) == 13
    assert got.finished[TaskStatus.COMPLETED][5] == 10
    assert got.finished[TaskStatus.FAILED][10] == 4
    assert got.finished[TaskStatus.CANCELLED][20] == 1
    assert sum(sum(series) for series in got.finished.values()) == 15

    # Run times 2, 4, ..., 20 s: p50 11 s; p95 interpolated 55% from 18 to 20 s.
    assert got.run_time[5] == overview.Percentiles(count=10, p50=pytest.approx(11.0), p95=pytest.approx(19.1))
    assert got.run_time[10] == overview.Percentiles(count=4, p50=pytest.approx(1.0), p95=pytest.approx(1.0))
    assert got.run_time[20] == overview.Percentiles()  # it never ran
    assert got.run_time_overall.count == 14
    # Waits 1..10 s.
    assert got.queue_wait[5] == overview.Percentiles(count=10, p50=pytest.approx(5.5), p95=pytest.approx(9.55))
    assert got.queue_wait[20] == overview.Percentiles(count=1, p50=pytest.approx(30.0), p95=pytest.approx(30.0))
    waited = (now - minute[57]).total_seconds()
    assert got.queue_wait[57] == overview.Percentiles(count=1, p50=pytest.approx(waited), p95=pytest.approx(waited))
    assert got.queue_wait[58].p50 == pytest.approx(4.0)
    assert got.queue_wait_overall.count == 13
    assert got.queue_wait_overall.p50 == pytest.approx(6.0)  # 1..10, 4, 30 and the queued one's

    assert got.failures_by_tool == [("flaky", 3), ("broken", 1)]
    assert (got.failures_other, got.failures_total) == (0, 4)


def test_the_day_holds_what_the_hour_does_not(figures):
    now = timezone.now()
    day = overview.last_day(now)
    old = completed_task()
    finished = now - 90 * MINUTE
    stamp(old, created_at=now - timedelta(days=2), started_at=finished - 8 * SECOND, finished_at=finished)
    recent = failed_task(tool="flaky")
    stamp(recent, created_at=now - 3 * timedelta(hours=1), started_at=None)

    got = figures(day, now)

    assert day.step == timedelta(minutes=15) and day.buckets == 96
    assert got.finished[TaskStatus.COMPLETED][day.bucket_of(finished)] == 1
    assert got.run_time_overall == overview.Percentiles(count=1, p50=pytest.approx(8.0), p95=pytest.approx(8.0))
    assert got.created[TaskStatus.FAILED][day.bucket_of(now - 3 * timedelta(hours=1))] == 1
    assert sum(sum(series) for series in got.created.values()) == 1  # the old task was created before the day
    assert got.failures_by_tool == [("flaky", 1)]


def test_an_empty_window_has_zeros_and_no_percentiles(figures):
    now = timezone.now()
    got = figures(overview.last_hour(now), now)
    assert all(n == 0 for series in got.created.values() for n in series)
    assert all(n == 0 for series in got.finished.values() for n in series)
    assert got.run_time == [overview.Percentiles()] * 60
    assert got.queue_wait_overall == overview.Percentiles()
    assert got.failures_by_tool == [] and got.failures_total == 0


def test_failures_name_the_top_tools_and_sum_the_rest(figures):
    now = timezone.now()
    for i in range(overview.TOP_TOOLS + 2):
        for _ in range(i + 1):
            failed_task(tool=f"tool_{i:02d}")
    got = figures(overview.last_hour(now + MINUTE), now + MINUTE)
    assert got.failures_by_tool[0] == (f"tool_{overview.TOP_TOOLS + 1:02d}", overview.TOP_TOOLS + 2)
    assert len(got.failures_by_tool) == overview.TOP_TOOLS
    assert got.failures_other == 1 + 2  # tool_00 and tool_01
    assert got.failures_total == sum(range(1, overview.TOP_TOOLS + 3))


# Windows and gauges -----------------------------------------------------------------------


def test_windows_are_aligned_and_end_with_the_bucket_of_now():
    now = datetime(2026, 11, 26, 14, 7, 31, tzinfo=UTC)
    hour = overview.last_hour(now)
    assert hour.start == datetime(2026, 11, 26, 13, 8, tzinfo=UTC)
    assert hour.end == datetime(2026, 11, 26, 14, 8, tzinfo=UTC)
    assert hour.bucket_of(now) == 59
    day = overview.last_day(now)
    assert day.end == datetime(2026, 11, 26, 14, 15, tzinfo=UTC)
    assert day.start == datetime(2026, 11, 25, 14, 15, tzinfo=UTC)
    assert day.bucket_of(now) == 95


def test_gauges_read_the_active_counter_and_the_waiting_tasks():
    assert overview.gauges() == overview.Gauges(working=0, input_required=0)
    running_task()
    make_task()  # queued: working too
    waiting_task(owner="bob")
    waiting_task(owner="carol")
    completed_task()
    failed_task()
    assert overview.gauges() == overview.Gauges(working=2, input_required=2)


def test_the_waiting_gauge_is_capped(monkeypatch):
    monkeypatch.setattr(overview, "GAUGE_COUNT_CAP", 2)
    for owner in ("a", "b", "c"):
        waiting_task(owner=owner)
    running_task()
    got = overview.gauges()
    assert got == overview.Gauges(working=2, input_required=2, input_required_capped=True)


def test_percentile_interpolates_like_percentile_cont():
    assert overview.percentile([1.0], 0.95) == 1.0
    assert overview.percentile([1.0, 2.0], 0.5) == 1.5
    assert overview.percentile([float(v) for v in range(1, 101)], 0.95) == pytest.approx(95.05)


def test_queue_waits_are_split_by_the_queue_of_each_tools_runs(figures, settings):
    """A tool's own queue (here set by the site), the site's run queue for
    the others; a run still queued on a queue nobody consumes shows its wait so far."""
    settings.MCPTASKS = {
        **settings.MCPTASKS,
        "CELERY_QUEUE": "runs",
        "TOOL_CONTROLS": {"gpu_render": {"queue": "gpu"}},
    }
    now = timezone.now()
    hour = overview.last_hour(now)
    minute = hour.bucket_starts()
    for k in (1, 2, 3):
        task = completed_task()
        stamp(task, created_at=minute[5], started_at=minute[5] + k * SECOND, finished_at=minute[6])
    stuck = make_task(tool="gpu_render")
    stamp(stuck, created_at=minute[50])

    got = dict(figures(hour, now).queue_wait_by_queue)

    assert set(got) == {"runs", "gpu"}
    assert got["runs"] == overview.Percentiles(count=3, p50=pytest.approx(2.0), p95=pytest.approx(2.9))
    waited = (now - minute[50]).total_seconds()
    assert got["gpu"] == overview.Percentiles(count=1, p50=pytest.approx(waited), p95=pytest.approx(waited))
