"""The sweeper (lost runs) and the prune (expired tasks)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from mcptasks.models import InputRequest, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from tests.support.factories import (
    WORKER,
    bulk_expired_tasks,
    completed_task,
    failed_task,
    make_task,
    running_task,
    waiting_task,
)

pytestmark = pytest.mark.django_db


def lapse(task: Task, seconds: float = 5) -> None:
    Task.objects.filter(pk=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=seconds))


def runs(published: list[dict]) -> list[list[str]]:
    return [m["args"] for m in published if m["task"] == "mcptasks.run_task"]


# Sweep --------------------------------------------------------------------------------------------


def test_sweep_redispatches_a_run_whose_lease_lapsed(django_capture_on_commit_callbacks, published):
    task = running_task()
    lapse(task)
    with django_capture_on_commit_callbacks(execute=True):
        report = lifecycle.sweep()
    assert (report.redispatched, report.failed) == (1, 0)
    task = Task.objects.get(pk=task.id)
    assert task.status == TaskStatus.WORKING
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    assert task.dispatched_at > timezone.now() - timedelta(seconds=10)
    assert TaskEvent.objects.filter(task=task, kind="redispatched").count() == 1
    assert runs(published) == [[task.id]]
    assert lifecycle.claim(task.id, worker="next") is not None


def test_sweep_leaves_live_leases_alone(django_capture_on_commit_callbacks, published):
    task = running_task()
    with django_capture_on_commit_callbacks(execute=True):
        report = lifecycle.sweep()
    assert (report.redispatched, report.failed) == (0, 0)
    assert Task.objects.get(pk=task.id).lease_owner == WORKER
    assert runs(published) == []


def test_sweep_fails_a_task_that_used_up_its_attempts(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ATTEMPTS": 2}
    task = running_task()
    Task.objects.filter(pk=task.id).update(attempts=2)
    lapse(task)
    report = lifecycle.sweep()
    assert (report.redispatched, report.failed) == (0, 1)
    task = Task.objects.get(pk=task.id)
    assert task.status == TaskStatus.FAILED
    assert task.error["code"] == -32603
    assert "lost 2 times" in task.error["message"]
    assert task.status_message


def test_sweep_redispatches_a_lost_message_after_the_grace_period(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "DISPATCH_GRACE_SECONDS": 30}
    recent = make_task()
    old = make_task()
    never = make_task()
    now = timezone.now()
    Task.objects.filter(pk=recent.id).update(dispatched_at=now - timedelta(seconds=5))
    Task.objects.filter(pk=old.id).update(dispatched_at=now - timedelta(seconds=60))
    report = lifecycle.sweep()
    assert report.redispatched == 2
    redispatched = set(TaskEvent.objects.filter(kind="redispatched").values_list("task_id", flat=True))
    assert redispatched == {old.id, never.id}


def test_sweep_backs_off_a_task_nobody_claims(settings):
    """A task that is only waiting in a long queue is not re-enqueued at every
    sweep: the grace doubles with each re-enqueue since its last run started
    (capped), and a run that starts resets it."""
    settings.MCPTASKS = {**settings.MCPTASKS, "DISPATCH_GRACE_SECONDS": 30}
    task = make_task()

    def sweep_after(seconds: float) -> bool:
        """Dispatched ``seconds`` ago (as if that time had passed): re-enqueued now?"""
        Task.objects.filter(pk=task.id).update(dispatched_at=timezone.now() - timedelta(seconds=seconds))
        before = TaskEvent.objects.filter(task=task, kind="redispatched").count()
        lifecycle.sweep()
        return TaskEvent.objects.filter(task=task, kind="redispatched").count() == before + 1

    assert not sweep_after(29)
    assert sweep_after(31)  # 1 x grace
    assert not sweep_after(59)
    assert sweep_after(61)  # 2 x grace
    assert not sweep_after(119)
    assert sweep_after(121)  # 4 x grace
    assert not sweep_after(239)
    assert sweep_after(241)  # 8 x grace
    assert not sweep_after(479)
    assert sweep_after(481)  # 16 x grace: the cap
    assert not sweep_after(479)
    assert sweep_after(481)  # still 16 x grace
    assert Task.objects.get(pk=task.id).status == TaskStatus.WORKING

    # A run starts (and its worker lets go of it): back to one grace.
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    lifecycle.release(task.id, worker=WORKER)
    assert not sweep_after(29)
    assert sweep_after(31)
    assert not sweep_after(59)


def test_sweep_backoff_leaves_lapsed_leases_alone(settings):
    """A run whose lease lapsed is re-enqueued at once, however often it was before."""
    settings.MCPTASKS = {**settings.MCPTASKS, "DISPATCH_GRACE_SECONDS": 30, "MAX_ATTEMPTS": 10}
    task = make_task()
    for _ in range(3):
        Task.objects.filter(pk=task.id).update(dispatched_at=timezone.now() - timedelta(hours=1))
        assert lifecycle.sweep().redispatched == 1
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    lapse(task)
    assert lifecycle.sweep().redispatched == 1
    assert TaskEvent.objects.filter(task=task, kind="redispatched").count() == 4


def test_sweep_ignores_waiting_and_terminal_tasks():
    waiting = waiting_task()
    done = completed_task()
    failed = failed_task()
    Task.objects.update(lease_expires_at=timezone.now() - timedelta(hours=1), dispatched_at=None)
    report = lifecycle.sweep()
    assert (report.redispatched, report.failed) == (0, 0)
    assert Task.objects.get(pk=waiting.id).status == TaskStatus.INPUT_REQUIRED
    assert Task.objects.get(pk=done.id).status == TaskStatus.COMPLETED
    assert Task.objects.get(pk=failed.id).status == TaskStatus.FAILED


def test_sweep_dry_run_changes_nothing(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ATTEMPTS": 2}
    stuck = running_task()
    doomed = running_task(worker="w2")
    Task.objects.filter(pk=doomed.id).update(attempts=2)
    lapse(stuck)
    lapse(doomed)
    before = list(Task.objects.order_by("id").values())
    report = lifecycle.sweep(dry_run=True)
    assert (report.redispatched, report.failed) == (1, 1)
    assert list(Task.objects.order_by("id").values()) == before
    assert not TaskEvent.objects.filter(kind="redispatched").exists()


def test_sweep_command(capsys):
    task = running_task()
    lapse(task)
    call_command("mcptasks", "sweep", "--dry-run")
    assert "would re-enqueue 1" in capsys.readouterr().out
    assert Task.objects.get(pk=task.id).lease_owner == WORKER
    call_command("mcptasks", "sweep")
    assert "re-enqueued 1" in capsys.readouterr().out
    assert Task.objects.get(pk=task.id).lease_owner == ""


# Prune --------------------------------------------------------------------------------------------------


def expire(*tasks: Task) -> None:
    Task.objects.filter(pk__in=[t.id for t in tasks]).update(expires_at=timezone.now() - timedelta(minutes=1))


@pytest.mark.usefixtures("transition_paths")
def test_prune_deletes_expired_terminal_tasks_with_their_rows():
    done = completed_task()
    waiting = waiting_task()
    lifecycle.cancel(waiting.id, actor="client:alice")
    fresh = completed_task()
    expire(done, waiting)
    assert lifecycle.prune_expired() == 2
    assert set(Task.objects.values_list("id", flat=True)) == {fresh.id}
    assert not TaskEvent.objects.filter(task_id__in=[done.id, waiting.id]).exists()
    assert not InputRequest.objects.filter(task_id=waiting.id).exists()


@pytest.mark.usefixtures("transition_paths")
def test_prune_never_deletes_an_active_task():
    running = running_task()
    waiting = waiting_task()
    unclaimed = make_task()
    expire(running, waiting, unclaimed)
    assert lifecycle.prune_expired() == 0
    assert Task.objects.count() == 3


@pytest.mark.usefixtures("transition_paths")
def test_prune_dry_run_counts_only():
    tasks = [completed_task() for _ in range(3)]
    expire(*tasks)
    assert lifecycle.prune_expired(dry_run=True) == 3
    assert Task.objects.count() == 3


@pytest.mark.usefixtures("transition_paths")
def test_prune_works_in_batches():
    tasks = [completed_task() for _ in range(10)]
    expire(*tasks)
    assert lifecycle.prune_expired(batch_size=3, max_batches=2) == 6
    assert Task.objects.count() == 4
    assert lifecycle.prune_expired(batch_size=3) == 4
    assert Task.objects.count() == 0


def test_prune_pauses_between_full_batches(monkeypatch, settings):
    """A long prune leaves the database to the requests between batches; a
    batch that found the last rows ends it without a pause."""
    from mcptasks.tasks import maintenance as module

    settings.MCPTASKS = {**settings.MCPTASKS, "PRUNE_PAUSE_SECONDS": 0.25}
    pauses: list[float] = []
    monkeypatch.setattr(module.time, "sleep", pauses.append)
    expire(*[completed_task() for _ in range(7)])
    assert lifecycle.prune_expired(batch_size=3) == 7
    assert pauses == [0.25, 0.25], "after the two full batches, not after the last one"


def test_prune_command(capsys):
    tasks = [completed_task() for _ in range(2)]
    expire(*tasks)
    call_command("mcptasks", "prune", "--dry-run")
    assert "would delete 2" in capsys.readouterr().out
    call_command("mcptasks", "prune", "--batch-size", "1")
    assert "deleted 2" in capsys.readouterr().out
    assert not Task.objects.exists()


BULK = 20_000


def test_prune_a_large_backlog():
    bulk_expired_tasks(BULK)
    running = running_task()
    expire(running)
    assert Task.objects.filter(owner="bulk").count() == BULK
    started = time.monotonic()
    deleted = lifecycle.prune_expired(batch_size=1000)
    elapsed = time.monotonic() - started
    print(f"pruned {deleted} tasks in {elapsed:.2f}s")
    assert deleted == BULK
    assert not Task.objects.filter(owner="bulk").exists()
    assert not TaskEvent.objects.filter(task__owner="bulk").exists()
    assert Task.objects.get(pk=running.id).status == TaskStatus.WORKING
    assert elapsed < 120, f"pruning {BULK} rows took {elapsed:.1f}s"


def test_prune_stops_after_max_batches_on_a_large_backlog():
    bulk_expired_tasks(2_500)
    assert lifecycle.prune_expired(batch_size=1000, max_batches=2) == 2000
    assert Task.objects.filter(owner="bulk").count() == 500
    # Oldest expiry first: the ones left are the most recently expired.
    left = set(Task.objects.filter(owner="bulk").values_list("id", flat=True))
    assert left == {f"bulk-{g}" for g in range(1, 501)}
