"""``manage.py mcptasks``: every sub-command, its counts and its ``--dry-run``.

The sweeper against a worker killed mid-run is in tests/test_live_recovery.py;
the sweep and prune internals in tests/test_maintenance.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from mcptasks.models import InputRequest, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from mcptasks.tools.registry import registry, tool
from tests.support import live
from tests.support.factories import (
    WORKER,
    accept,
    bulk_expired_tasks,
    cancelled_task,
    completed_task,
    failed_task,
    make_task,
    running_task,
    waiting_task,
)

pytestmark = pytest.mark.django_db


def mcptasks(*args: str) -> str:
    out = StringIO()
    call_command("mcptasks", *args, stdout=out)
    return out.getvalue()


def on(command: str, task: Task | str, *options: str) -> str:
    """``mcptasks <command> [options] -- <id>``: an id may start with "-"."""
    return mcptasks(command, *options, "--", getattr(task, "id", task))


def reload(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


@pytest.fixture
def idempotent_tool():
    @tool(name="cmd_test_idempotent", task="optional", annotations={"readOnlyHint": True})
    def fn() -> str:
        return "ok"

    try:
        yield
    finally:
        registry.unregister("cmd_test_idempotent")


# sweep ---------------------------------------------------------------------------------------------


def lapse(*tasks: Task) -> None:
    Task.objects.filter(pk__in=[t.id for t in tasks]).update(lease_expires_at=timezone.now() - timedelta(seconds=5))


def test_sweep_reports_reruns_and_failures_and_dry_run_changes_nothing(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ATTEMPTS": 2}
    stuck = running_task()
    doomed = running_task(worker="w2")
    Task.objects.filter(pk=doomed.id).update(attempts=2)
    lapse(stuck, doomed)
    assert mcptasks("sweep", "--dry-run") == "sweep: would re-enqueue 1, would fail 1\n"
    assert reload(stuck).lease_owner == WORKER and reload(doomed).status == TaskStatus.WORKING
    assert mcptasks("sweep") == "sweep: re-enqueued 1, failed 1\n"
    assert reload(stuck).lease_owner == ""
    assert reload(doomed).status == TaskStatus.FAILED
    assert mcptasks("sweep") == "sweep: re-enqueued 0, failed 0\n"


def test_sweep_limit():
    tasks = [running_task(worker=f"w{i}") for i in range(3)]
    lapse(*tasks)
    assert mcptasks("sweep", "--limit", "2") == "sweep: re-enqueued 2, failed 0\n"
    assert mcptasks("sweep") == "sweep: re-enqueued 1, failed 0\n"


# prune ---------------------------------------------------------------------------------------------


def expire(*tasks: Task) -> None:
    Task.objects.filter(pk__in=[t.id for t in tasks]).update(expires_at=timezone.now() - timedelta(minutes=1))


def test_prune_counts_dry_run_batches_and_max_batches():
    done = [completed_task() for _ in range(5)]
    running = running_task()
    expire(*done, running)
    assert mcptasks("prune", "--dry-run") == "prune: would delete 5 expired task(s)\n"
    assert Task.objects.count() == 6
    assert mcptasks("prune", "--batch-size", "2", "--max-batches", "1") == "prune: deleted 2 expired task(s)\n"
    assert mcptasks("prune", "--batch-size", "2") == "prune: deleted 3 expired task(s)\n"
    assert list(Task.objects.values_list("id", flat=True)) == [running.id]


BULK = 30_000


@pytest.mark.django_db(transaction=True)
def test_prune_of_a_large_backlog_never_stalls_polls(rpc, settings):
    """While ``manage.py mcptasks prune`` (its own process, as on a worker)
    deletes 30,000 expired tasks and their events in batches of 1,000, polls
    of a live task keep answering at once: a batch is a short transaction
    and locks only the rows it deletes."""
    # Polls here come faster than a client honouring pollIntervalMs would send them.
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": None}
    bulk_expired_tasks(BULK)
    polled = lifecycle.create_task(owner="anonymous", tool_name="slow_compute", arguments={}, enqueue=False)
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        url = f"sqlite:///{db['NAME']}"
    else:
        url = live.with_database(live.os.environ["DATABASE_URL"], db["NAME"])
    env = live.base_env({"DATABASE_URL": url})
    started = time.monotonic()
    pruner = subprocess.Popen(
        [sys.executable, "manage.py", "mcptasks", "prune", "--batch-size", "1000"],
        cwd=live.REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    latencies: list[float] = []
    while pruner.poll() is None:
        t0 = time.monotonic()
        reply = rpc.tasks_get(polled.id)
        latencies.append(time.monotonic() - t0)
        assert reply.result["status"] == "working"
        time.sleep(0.01)
    out, err = pruner.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert pruner.returncode == 0, err
    assert out == f"prune: deleted {BULK} expired task(s)\n"
    assert not Task.objects.filter(owner="bulk").exists()
    assert not TaskEvent.objects.filter(actor="client:bulk").exists()
    assert len(latencies) >= 5, f"only {len(latencies)} polls in {elapsed:.1f}s"
    latencies.sort()
    median, worst = latencies[len(latencies) // 2], latencies[-1]
    ms = {"median": round(median * 1000), "worst": round(worst * 1000)}
    print(f"pruned {BULK} in {elapsed:.1f}s; {len(latencies)} polls, ms: {ms}")
    assert worst < 1.0, f"a poll waited {worst:.2f}s during the prune"


# inspect -------------------------------------------------------------------------------------------


def test_inspect_shows_the_task_its_inputs_and_events():
    task = waiting_task(keys=["first", "second"], arguments={"seconds": 2})
    lifecycle.submit_input(task.id, {"first": accept(confirm=True)}, actor="client:alice")
    data = json.loads(on("inspect", task.id))
    assert data["task"]["taskId"] == task.id and data["task"]["status"] == "input_required"
    assert set(data["task"]["inputRequests"]) == {"second"}
    assert (data["owner"], data["tool"], data["arguments"]) == ("alice", "slow_compute", {"seconds": 2})
    assert [(r["key"], r["state"]) for r in data["input_requests"]] == [("first", "answered"), ("second", "pending")]
    assert data["input_requests"][0]["response"] == accept(confirm=True)
    assert [e["kind"] for e in data["events"]] == ["created", "run_started", "transition", "input"]
    assert data["events"][-1]["actor"] == "client:alice"
    assert data["events"][-1]["detail"] == {"keys": ["first"]}


def test_an_id_that_starts_with_a_dash_is_passed_after_double_dash():
    task = make_task()
    dashed = "-" + task.id[1:]
    TaskEvent.objects.filter(task_id=task.id).update(task_id=dashed)
    Task.objects.filter(pk=task.id).update(id=dashed)
    assert json.loads(mcptasks("inspect", "--", dashed))["task"]["taskId"] == dashed
    assert mcptasks("cancel", "--by", "maria", "--", dashed) == "cancel: cancelled 1 task(s)\n"


def test_inspect_unknown_task():
    with pytest.raises(CommandError, match="No task 'nope'"):
        on("inspect", "nope")


# cancel --------------------------------------------------------------------------------------------


def test_cancel_dry_run_then_cancel_with_reason_and_operator():
    task = running_task()
    assert on("cancel", task.id, "--dry-run") == "cancel: would cancel 1 task (working)\n"
    assert reload(task).status == TaskStatus.WORKING
    out = on("cancel", task.id, "--by", "maria", "--reason", "Runaway job")
    assert out == "cancel: cancelled 1 task(s)\n"
    task = reload(task)
    assert (task.status, task.status_message, task.cancelled_by) == ("cancelled", "Runaway job", "operator:maria")
    assert TaskEvent.objects.get(task=task, to_status="cancelled").actor == "operator:maria"


def test_cancel_defaults_to_the_os_user(monkeypatch):
    monkeypatch.setenv("MCPTASKS_OPERATOR", "oncall")
    task = waiting_task()
    on("cancel", task.id)
    assert reload(task).cancelled_by == "operator:oncall"
    assert not InputRequest.objects.filter(task=task, state="pending").exists()


def test_cancel_refuses_a_finished_or_unknown_task():
    with pytest.raises(CommandError, match="already completed"):
        on("cancel", completed_task().id)
    with pytest.raises(CommandError, match="No task"):
        on("cancel", "nope")


# expire --------------------------------------------------------------------------------------------


def test_expire_makes_a_finished_task_prunable():
    task = failed_task()
    assert on("expire", task.id, "--dry-run") == "expire: would expire 1 task (failed)\n"
    assert reload(task).expires_at > timezone.now()
    assert on("expire", task.id, "--by", "maria").startswith("expire: expired 1 task(s)")
    assert TaskEvent.objects.get(task=task, kind="expired").actor == "operator:maria"
    assert mcptasks("prune") == "prune: deleted 1 expired task(s)\n"


def test_expire_refuses_an_active_task():
    task = running_task()
    with pytest.raises(CommandError, match="cancel it first"):
        on("expire", task.id)
    assert reload(task).status == TaskStatus.WORKING


# retry ---------------------------------------------------------------------------------------------


def test_retry_starts_one_new_task(idempotent_tool):
    old = cancelled_task(tool="cmd_test_idempotent")
    assert on("retry", old.id, "--dry-run") == "retry: would start 1 new task (cmd_test_idempotent)\n"
    assert Task.objects.count() == 1
    out = on("retry", old.id, "--by", "maria")
    new_id = out.split()[-1]
    assert out == f"retry: started 1 new task {new_id}\n"
    new = Task.objects.get(pk=new_id)
    assert (new.status, new.owner, new.tool_name) == ("working", old.owner, "cmd_test_idempotent")
    assert TaskEvent.objects.get(task=old, kind="retried").detail == {"new_task_id": new_id}
    with pytest.raises(CommandError, match="retried already"):
        on("retry", old.id)


def test_retry_refuses_unsafe_tasks(idempotent_tool):
    with pytest.raises(CommandError, match="is completed"):
        on("retry", completed_task(tool="cmd_test_idempotent").id)
    with pytest.raises(CommandError, match="not marked read-only or idempotent"):
        on("retry", failed_task(tool="slow_compute").id)


# stats ---------------------------------------------------------------------------------------------


def test_stats_counts_statuses_tools_and_what_needs_attention():
    running_task()
    stuck = running_task(worker="w2")
    lapse(stuck)
    waiting_task()
    completed_task(tool="greet")
    old = failed_task()
    expire(old)
    lost = make_task()
    Task.objects.filter(pk=lost.id).update(dispatched_at=timezone.now() - timedelta(hours=1))
    out = mcptasks("stats")
    lines = [line.split() for line in out.splitlines()]
    counts = {parts[0]: int(parts[1]) for parts in lines if len(parts) == 2 and parts[1].isdigit()}
    assert counts == {
        "working": 3,
        "input_required": 1,
        "completed": 1,
        "failed": 1,
        "cancelled": 0,
        "slow_compute": 5,
        "greet": 1,
    }
    assert "tasks waiting on input requests: 1" in out
    assert "running with a lapsed lease (the next sweep re-runs them): 1" in out
    assert "unclaimed past the dispatch grace (the next sweep re-enqueues them): 1" in out
    assert "finished and expired (the next prune deletes them): 1" in out
    assert "oldest active task created: 20" in out


def test_stats_on_an_empty_table():
    out = mcptasks("stats")
    assert "working         0" in out and "oldest active task created: -" in out


def test_queues_lists_each_tools_queue_limits_and_retries(settings):
    @tool(name="cmd_test_render", task="required", queue="gpu", soft_time_limit=50, time_limit=60)
    def render() -> str:
        return "ok"

    @tool(name="cmd_test_quote", task="required", retries=3, retry_on=(ConnectionError,))
    def quote() -> str:
        return "ok"

    try:
        settings.MCPTASKS = {**settings.MCPTASKS, "CELERY_QUEUE": "runs"}
        lines = mcptasks("queues").splitlines()
        assert "cmd_test_render: gpu (soft limit 50 s, limit 60 s)" in lines
        assert "cmd_test_quote: runs (3 retries)" in lines
    finally:
        registry.unregister("cmd_test_render")
        registry.unregister("cmd_test_quote")
