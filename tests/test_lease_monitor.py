"""One lease monitor per worker process (``mcptasks.worker.leases``): a
single thread watches every run, renews all their leases together, and
stops exactly the runs whose task was cancelled or whose lease was taken."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mcptasks import ToolContext
from mcptasks.models import Task
from mcptasks.tasks import lifecycle
from mcptasks.worker import leases
from mcptasks.worker.execution import run_task
from tests.support.factories import make_task, running_task
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


def _lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mcptasks-lease")]


@pytest.fixture
def quick_ticks(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "CANCEL_POLL_SECONDS": 0.05, "HEARTBEAT_SECONDS": 0.2}


@pytest.mark.usefixtures("quick_ticks")
def test_one_thread_watches_every_run_and_stops_only_the_lost_ones() -> None:
    monitor = leases.monitor
    runs = {f"worker-{n}": running_task(worker=f"worker-{n}") for n in range(4)}
    events = {worker: threading.Event() for worker in runs}
    for worker, task in runs.items():
        monitor.watch(task.id, worker, events[worker])
    before = {worker: Task.objects.get(pk=task.id).lease_expires_at for worker, task in runs.items()}

    lifecycle.cancel(runs["worker-0"].id, actor="client:alice")
    Task.objects.filter(pk=runs["worker-1"].id).update(lease_owner="someone-else")  # the lease was taken over
    wait_until(lambda: events["worker-0"].is_set() and events["worker-1"].is_set(), timeout=10)
    assert monitor.watched() == 2

    # The others' leases are renewed, together.
    wait_until(
        lambda: all(Task.objects.get(pk=runs[w].id).lease_expires_at > before[w] for w in ("worker-2", "worker-3")),
        timeout=10,
    )
    assert not events["worker-2"].is_set() and not events["worker-3"].is_set()
    assert monitor._thread is not None and sum(t is monitor._thread for t in _lease_threads()) == 1
    monitor.forget("worker-2")
    monitor.forget("worker-3")
    wait_until(lambda: monitor._lock._waiters, timeout=10)  # its thread waits for a run


def test_runs_leave_the_process_monitor_when_they_end(temp_tool: Any) -> None:
    @temp_tool(task="required", description="Returns at once.")
    def instant() -> str:
        return "done"

    others = [t for t in _lease_threads() if t is not leases.monitor._thread]
    for _ in range(5):
        task = make_task(tool="instant")
        assert run_task(task.id) == "completed"
        assert leases.monitor.watched() == 0
    assert [t for t in _lease_threads() if t is not leases.monitor._thread] == others


@pytest.mark.usefixtures("quick_ticks")
def test_a_cancel_reaches_a_running_tool_through_the_process_monitor(temp_tool: Any) -> None:
    started = threading.Event()

    @temp_tool(task="required", description="Waits to be cancelled.")
    def waits(ctx: ToolContext) -> str:
        started.set()
        ctx.sleep(20)
        return "not cancelled"

    tasks = [make_task(tool="waits") for _ in range(3)]
    outcomes: dict[str, str] = {}
    threads = [threading.Thread(target=lambda t=t: outcomes.__setitem__(t.id, run_task(t.id))) for t in tasks]
    for thread in threads:
        thread.start()
    wait_until(lambda: leases.monitor.watched() == 3, timeout=10)
    assert [t for t in _lease_threads() if t.is_alive()] == [leases.monitor._thread], "three runs, one thread"
    begun = time.monotonic()
    for task in tasks:
        lifecycle.cancel(task.id, actor="client:alice")
    for thread in threads:
        thread.join(10)
    assert outcomes == {task.id: "cancelled" for task in tasks}
    assert time.monotonic() - begun < 5
    assert [t for t in _lease_threads() if t.is_alive()] == [leases.monitor._thread]
    assert all(Task.objects.get(pk=t.id).status == "cancelled" for t in tasks)
