"""The per-owner count of active tasks (mcptasks.tasks.quota): kept equal to
the tasks' COUNT by every creation and every move to a terminal status, on
both paths, under concurrency, and recounted by the prune's reconcile."""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from mcptasks.models import ACTIVE_STATUSES, ActiveTaskCount, Task, TaskStatus
from mcptasks.tasks import lifecycle, quota
from tests.support import postgres_only
from tests.support.factories import WORKER, elicit, make_task, running_task, waiting_task

pytestmark = pytest.mark.django_db


def active(owner: str) -> int:
    return Task.objects.filter(owner=owner, status__in=ACTIVE_STATUSES).count()


def assert_counted(*owners: str) -> None:
    for owner in owners:
        assert quota.active_count(owner) == active(owner), owner


@pytest.fixture
def quota_limit(settings):
    def apply(limit: int | None) -> None:
        settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ACTIVE_TASKS_PER_OWNER": limit}

    return apply


@pytest.mark.usefixtures("transition_paths")
@pytest.mark.parametrize("limit", [None, 3, 1000])
def test_every_terminal_move_takes_the_task_out_of_the_count(limit, quota_limit, settings):
    """Creations, and each way a task ends, keep the count equal to the COUNT:
    completion, failure (by the run and by the system), cancellation, an
    operator's expiry of a running task, the sweeper giving up, and a run
    abandoned after too many attempts. Moves between active statuses and
    the prune of finished tasks leave it alone."""
    quota_limit(limit)
    owner = "counted"
    # Completed by its run.
    task = running_task(owner=owner)
    assert_counted(owner)
    assert lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    assert_counted(owner)
    assert not lifecycle.complete(task.id, {"content": []}, worker=WORKER), "terminal is final"
    assert_counted(owner)
    # Failed by its run (the era's rule), and by the system.
    task = running_task(owner=owner)
    assert lifecycle.finish_run(task.id, {"content": [], "isError": True}, worker=WORKER, to=TaskStatus.FAILED)
    assert lifecycle.fail(running_task(owner=owner).id, {"code": -32603, "message": "x"}, actor="system")
    assert_counted(owner)
    # Waiting for input and back is active throughout; a cancel while waiting ends it.
    task = waiting_task(keys=["k"], owner=owner)
    assert_counted(owner)
    assert lifecycle.submit_input(task.id, {"k": {"action": "accept"}}, actor="client:counted") == ["k"]
    assert_counted(owner)
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    assert lifecycle.request_input(task.id, {"again": elicit()}, worker=WORKER)
    assert lifecycle.cancel(task.id, actor="client:counted")
    assert not lifecycle.cancel(task.id, actor="client:counted")
    assert_counted(owner)
    # An operator expires a running task (cancelled first).
    assert lifecycle.expire_now(make_task(owner=owner).id, actor="operator:root")
    assert_counted(owner)
    # The sweeper gives up on a run lost too often.
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ATTEMPTS": 1}
    task = running_task(owner=owner)
    Task.objects.filter(pk=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    assert lifecycle.sweep().failed == 1
    assert_counted(owner)
    # A claim past MAX_ATTEMPTS abandons the run.
    task = running_task(owner=owner)
    Task.objects.filter(pk=task.id).update(lease_expires_at=None, lease_owner="")
    assert lifecycle.claim(task.id, worker="next") is None
    assert Task.objects.get(pk=task.id).status == TaskStatus.FAILED
    assert_counted(owner)
    # Still-active tasks are counted; the prune deletes finished ones only.
    make_task(owner=owner)
    Task.objects.filter(owner=owner).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.prune_expired() > 0
    assert active(owner) == 1
    assert_counted(owner)
    assert quota.reconcile() == 0, "nothing drifted"


@pytest.mark.usefixtures("transition_paths")
def test_a_finished_task_frees_its_place_in_the_quota(quota_limit):
    quota_limit(2)
    first = running_task(owner="full")
    make_task(owner="full")
    with pytest.raises(lifecycle.TooManyActiveTasks):
        make_task(owner="full")
    assert lifecycle.complete(first.id, {"content": []}, worker=WORKER)
    make_task(owner="full")
    assert_counted("full")


@postgres_only.SINGLE_STATEMENT
@pytest.mark.parametrize("limit", [None, 1000])
def test_a_creation_is_one_statement(limit, quota_limit):
    """No COUNT first: the owner's count, the task and its event are one
    statement, with or without the quota (far below it)."""
    quota_limit(limit)
    make_task(owner="one")
    with CaptureQueriesContext(connection) as queries:
        make_task(owner="one")
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert "count(" not in queries[0]["sql"].lower()
    assert_counted("one")


@postgres_only.SINGLE_STATEMENT
@pytest.mark.parametrize("limit", [None, 1000])
def test_a_creation_takes_the_owners_quota_lock_shared_only_under_a_quota(limit, quota_limit):
    """Under a quota the statement holds the owner's lock shared to its
    commit, so an exclusive checker waits for it; with none it takes no lock."""
    from django.db import transaction

    quota_limit(limit)
    with transaction.atomic():
        make_task(owner="locker")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
            )
            modes = [row[0] for row in cursor.fetchall()]
    assert modes == ([] if limit is None else ["ShareLock"])
    assert_counted("locker")


@postgres_only.SINGLE_STATEMENT
def test_a_run_finish_is_still_one_statement():
    task = running_task(owner="fin")
    with CaptureQueriesContext(connection) as queries:
        assert lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert_counted("fin")


def _in_thread(work, errors: list[BaseException]) -> None:
    try:
        work()
    except BaseException as exc:
        errors.append(exc)
    finally:
        connection.close()


@contextlib.contextmanager
def creation_held_open(owner: str) -> Iterator[None]:
    """A creation of ``owner`` inside a transaction on another thread, left
    open until the block ends (then committed, with no error)."""
    from django.db import transaction

    created, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            make_task(owner=owner)
            created.set()
            release.wait(30)

    errors: list[BaseException] = []
    holder = threading.Thread(target=_in_thread, args=(hold, errors))
    holder.start()
    try:
        assert created.wait(10)
        yield
    finally:
        release.set()
        holder.join(30)
    assert errors == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("transition_paths")
@pytest.mark.parametrize("limit", [None, 40])
def test_the_count_is_exact_under_concurrent_creations_and_ends(limit, quota_limit):
    """Threads create, complete, fail and cancel tasks of one owner at once,
    and a reconcile runs among them: afterwards the count equals the COUNT,
    and at no point were more than the quota active."""
    quota_limit(limit)
    owner = "crowd"
    left: list[str] = []

    def churn(n: int) -> None:
        for i in range(6):
            try:
                task = running_task(owner=owner, worker=f"w{n}")
                if i % 3 == 0:
                    assert lifecycle.complete(task.id, {"content": []}, worker=f"w{n}")
                elif i % 3 == 1:
                    assert lifecycle.fail(task.id, {"code": -32603, "message": "x"}, actor="system")
                else:
                    assert lifecycle.cancel(task.id, actor="client:crowd")
                left.append(make_task(owner=owner).id)
            except lifecycle.TooManyActiveTasks:
                continue

    errors: list[BaseException] = []
    threads = [threading.Thread(target=_in_thread, args=(lambda n=n: churn(n), errors)) for n in range(8)]
    threads.append(threading.Thread(target=_in_thread, args=(quota.reconcile, errors)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert active(owner) == len(left)
    assert len(left) == (8 * 6 if limit is None else limit), "every place was taken, and no more"
    assert_counted(owner)
    assert quota.reconcile() == 0, "nothing drifted"
    assert ActiveTaskCount.objects.filter(owner=owner).count() == 1, "the reconcile folds the slots"


@postgres_only.CONCURRENT_WRITERS
@pytest.mark.django_db(transaction=True)
def test_a_finish_does_not_wait_for_a_creation_of_its_owner_in_flight(quota_limit):
    """A creation whose transaction is still open holds one of its owner's
    slots; a finish (and another creation) of that owner take another."""
    quota_limit(None)
    task = running_task(owner="busy")
    with creation_held_open("busy"):
        started = time.monotonic()
        assert lifecycle.complete(task.id, {"content": []}, worker=WORKER)
        make_task(owner="busy")
        assert time.monotonic() - started < 2, "a write waited for a creation's commit"
    assert_counted("busy")


@postgres_only.CONCURRENT_WRITERS
@pytest.mark.django_db(transaction=True)
def test_the_reconcile_skips_a_round_rather_than_wait_for_a_long_transaction(quota_limit):
    """A creation in a transaction left open holds its owner's slot: the
    reconcile gives up after its lock timeout instead of queueing every
    other writer behind it, and the next one recounts."""
    quota_limit(None)
    with creation_held_open("slow"):
        ActiveTaskCount.objects.create(owner="off", slot=0, active=4)
        started = time.monotonic()
        assert quota.reconcile() == 0
        assert time.monotonic() - started < 2
        assert quota.active_count("off") == 4, "skipped: nothing changed"
        make_task(owner="other")
    assert quota.reconcile() == 1
    assert_counted("slow", "off", "other")


def test_the_prune_reconciles_counts_that_drifted():
    """Rows written around the lifecycle (an import, a manual fix) leave the
    count wrong; the prune's reconcile recounts it and folds the slots."""
    make_task(owner="drift")
    make_task(owner="drift")
    ActiveTaskCount.objects.create(owner="drift", slot=7, active=5)
    ActiveTaskCount.objects.create(owner="ghost", slot=0, active=3)
    ActiveTaskCount.objects.create(owner="idle", slot=0, active=0)
    now = timezone.now()
    Task.objects.create(owner="direct", tool_name="slow_compute", created_at=now, updated_at=now)
    assert quota.active_count("drift") != active("drift")
    lifecycle.prune_expired()
    assert_counted("drift", "ghost", "direct", "idle")
    assert list(ActiveTaskCount.objects.order_by("owner").values_list("owner", "slot", "active")) == [
        ("direct", 0, 1),
        ("drift", 0, 2),
    ]
    assert quota.reconcile() == 0


def test_the_migration_backfills_the_counts_from_the_tasks():
    now = timezone.now()
    Task.objects.bulk_create(
        Task(owner=owner, tool_name="t", status=status, created_at=now, updated_at=now)
        for owner, status in [
            ("a", TaskStatus.WORKING),
            ("a", TaskStatus.INPUT_REQUIRED),
            ("a", TaskStatus.COMPLETED),
            ("b", TaskStatus.CANCELLED),
            ("c", TaskStatus.WORKING),
        ]
    )
    ActiveTaskCount.objects.all().delete()
    migration = importlib.import_module("mcptasks.migrations.0008_active_task_count")
    migration.backfill(django_apps, SimpleNamespace(connection=connection))
    assert sorted(ActiveTaskCount.objects.values_list("owner", "slot", "active")) == [("a", 0, 2), ("c", 0, 1)]
