"""Per-tool execution controls (queue, time limits, retries) on one run of a
task, in this process: ``run_task`` is what the Celery task calls. The live
counterparts, with real workers, are in tests/test_live_execution_controls.py."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from mcptasks import SoftTimeLimitExceeded, ToolContext
from mcptasks.models import Era, Task, TaskEvent, TaskStatus
from mcptasks.tasks import dispatch, lifecycle
from mcptasks.tools.controls import ToolControls
from mcptasks.tools.effective import controls_for, queue_for
from mcptasks.tools.registry import registry, tool
from mcptasks.worker.execution import run_task
from tests.support.factories import make_task
from tests.support.rpc import FULL_CAPS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("transition_paths")]


def new_task(tool_name: str, era: str = Era.MODERN) -> Task:
    return make_task(tool=tool_name, arguments={}, client_capabilities=FULL_CAPS, era=era)


def get(task: Task) -> Task:
    return Task.objects.get(pk=task.id)


def text_of(task: Task) -> str:
    return " ".join(block.get("text", "") for block in task.result["content"])


def mcp_settings(**values: Any) -> Any:
    from django.conf import settings

    return override_settings(MCPTASKS={**settings.MCPTASKS, **values})


# Queue ---------------------------------------------------------------------------------------


def test_a_runs_queue_is_its_tools_then_the_sites_setting_then_the_run_queue(temp_tool):
    @temp_tool(task="required", queue="gpu")
    def render() -> str:
        return "ok"

    @temp_tool(task="required")
    def plain() -> str:
        return "ok"

    assert dispatch.route("render").queue == "gpu"
    assert queue_for("plain") is None
    with mcp_settings(CELERY_QUEUE="runs", TOOL_CONTROLS={"render": {"queue": "big-gpu"}}):
        assert queue_for("render") == "big-gpu"
        assert queue_for("plain") == "runs"
        assert queue_for("not_ours") == "runs"


def test_the_hard_limit_rides_on_the_message_for_a_prefork_kill(temp_tool):
    @temp_tool(task="required", time_limit=4, soft_time_limit=2)
    def bounded() -> str:
        return "ok"

    route = dispatch.route("bounded")
    assert route.kill_after is not None and route.kill_after > 4


def test_options_that_contradict_themselves_are_refused():
    with pytest.raises(ValueError, match="soft_time_limit must be below time_limit"):
        tool(lambda: "x", name="contradicting", time_limit=1, soft_time_limit=2, registry=type(registry)())
    with pytest.raises(ValueError, match="retry_on"):
        tool(lambda: "x", name="no_exceptions", retries=2, registry=type(registry)())


def test_the_system_check_names_a_bad_site_setting(temp_tool):
    @temp_tool(task="required", time_limit=5)
    def limited() -> str:
        return "ok"

    bad = {
        "limited": {"soft_time_limit": 9},
        "typo": {"queeu": "x"},
        "typed": {"retries": "3"},
        "missing": {"retries": 1, "retry_on": ["no.such.Error"]},
    }
    with mcp_settings(TOOL_CONTROLS=bad):
        errors = [e for e in run_checks(tags=["mcptasks"]) if e.id == "mcptasks.E040"]
        # At run time a bad entry is left out, not fatal to the dispatch.
        assert controls_for("limited").soft_time_limit is None
    text = " | ".join(e.msg for e in errors)
    assert len(errors) == 4, text
    assert "soft_time_limit must be below time_limit" in text and "unknown options ['queeu']" in text
    assert "'retries'] has the wrong type" in text and "cannot import 'no.such.Error'" in text
    with mcp_settings(TOOL_CONTROLS={"limited": {"queue": "slow", "retries": 1, "retry_on": ["builtins.OSError"]}}):
        assert not [e for e in run_checks(tags=["mcptasks"]) if e.id == "mcptasks.E040"]
        assert controls_for("limited") == ToolControls(queue="slow", time_limit=5, retries=1, retry_on=(OSError,))


# Time limits ---------------------------------------------------------------------------------


def test_the_soft_limit_reaches_the_tool_through_its_context_and_it_may_clean_up(temp_tool):
    seen: dict[str, Any] = {}

    @temp_tool(task="required", soft_time_limit=0.5)
    def patient(ctx: ToolContext) -> str:
        try:
            ctx.sleep(30)
        except SoftTimeLimitExceeded:
            seen["cancelled"] = ctx.cancelled
            seen["cleaned"] = True
            raise
        return "never"

    task = new_task("patient")
    started = time.monotonic()
    assert run_task(task.id) == "tool_error"
    assert time.monotonic() - started < 1.5
    task = get(task)
    assert seen == {"cancelled": True, "cleaned": True}
    assert task.status == TaskStatus.COMPLETED and task.result["isError"] is True
    assert "soft time limit of 0.5 s" in text_of(task)


def test_check_cancelled_raises_at_the_soft_limit(temp_tool):
    @temp_tool(task="required", soft_time_limit=0.3)
    def looping(ctx: ToolContext) -> str:
        while True:
            time.sleep(0.05)
            ctx.check_cancelled()

    task = new_task("looping", era=Era.LEGACY)
    run_task(task.id)
    assert get(task).status == TaskStatus.FAILED  # 2025-11-25: a tool error fails the task
    assert "soft time limit of 0.3 s" in text_of(get(task))


def test_a_tool_that_ignores_the_limits_is_ended_at_the_hard_limit(temp_tool):
    @temp_tool(task="required", soft_time_limit=0.3, time_limit=0.8)
    def stubborn() -> str:
        time.sleep(2.5)
        return "too late"

    task = new_task("stubborn")
    started = time.monotonic()
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["run"] = run_task(task.id)
        connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while get(task).status == TaskStatus.WORKING and time.monotonic() - started < 5:
        time.sleep(0.05)
    ended = time.monotonic() - started
    task = get(task)
    assert task.status == TaskStatus.COMPLETED and task.result["isError"] is True
    assert "time limit of 0.8 s" in text_of(task)
    assert 0.8 <= ended < 1.8
    thread.join(5)
    # The tool's own late result is refused: the task keeps the limit's outcome, and so does the run.
    assert "time limit" in text_of(get(task))
    assert outcome["run"] == "tool_error"


# Retries -------------------------------------------------------------------------------------


def test_a_declared_exception_is_retried_with_backoff_and_then_completes(temp_tool):
    calls: list[int] = []

    @temp_tool(task="required", retries=2, retry_on=(ConnectionError,), retry_backoff=0.01, retry_backoff_max=0.02)
    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError(f"refused #{len(calls)}")
        return "made it"

    task = new_task("flaky")
    assert run_task(task.id) == "retrying"
    waiting = get(task)
    assert waiting.status == TaskStatus.WORKING and waiting.lease_owner == "" and waiting.attempts == 0
    assert waiting.status_message.startswith("Attempt 2 at ")
    assert "ConnectionError: refused #1" in waiting.status_message
    assert run_task(task.id) == "retrying"
    assert "Attempt 3" in get(task).status_message
    assert run_task(task.id) == "completed"
    task = get(task)
    assert task.status == TaskStatus.COMPLETED and task.result["isError"] is False and "made it" in text_of(task)
    kinds = list(TaskEvent.objects.filter(task=task).order_by("at", "id").values_list("kind", flat=True))
    assert kinds.count("run_started") == 3
    retries = list(TaskEvent.objects.filter(task=task, kind="tool_retry").values_list("detail", flat=True))
    assert [r["attempt"] for r in retries] == [2, 3]
    assert all(0.005 <= r["delay"] <= 0.02 for r in retries)
    assert task.attempts == 1  # a tool retry is not a lost run


def test_retries_end_on_the_error_once_spent_and_other_exceptions_are_not_retried(temp_tool):
    @temp_tool(task="required", retries=1, retry_on=(ConnectionError,), retry_backoff=0)
    def always_down() -> str:
        raise ConnectionError("down")

    @temp_tool(task="required", retries=3, retry_on=(ConnectionError,), retry_backoff=0)
    def wrong_kind() -> str:
        raise KeyError("not retried")

    task = new_task("always_down")
    assert run_task(task.id) == "retrying"
    assert run_task(task.id) == "tool_error"
    assert "ConnectionError: down" in text_of(get(task)) and get(task).result["isError"] is True

    other = new_task("wrong_kind")
    assert run_task(other.id) == "tool_error"
    assert get(other).result["isError"] is True
    assert not TaskEvent.objects.filter(task=other, kind="tool_retry").exists()


def test_a_cancel_during_the_backoff_ends_the_task_and_the_sweeper_leaves_a_backoff_alone(temp_tool):
    @temp_tool(task="required", retries=2, retry_on=(ConnectionError,), retry_backoff=60, retry_backoff_max=60)
    def slow_retry() -> str:
        raise ConnectionError("later")

    task = new_task("slow_retry")
    assert run_task(task.id) == "retrying"
    assert get(task).dispatched_at > timezone.now()
    with mcp_settings(DISPATCH_GRACE_SECONDS=0.01):
        report = lifecycle.sweep()
    assert (report.redispatched, report.failed) == (0, 0)
    assert lifecycle.cancel(task.id, actor="client:alice")
    assert get(task).status == TaskStatus.CANCELLED
    assert run_task(task.id) == "skipped"  # the delayed run finds it over


def test_the_backoff_doubles_up_to_its_cap_with_jitter():
    controls = ToolControls(retries=5, retry_on=(OSError,), retry_backoff=1, retry_backoff_max=5)
    rng = random.Random(7)
    for retry, ceiling in ((1, 1), (2, 2), (3, 4), (4, 5), (5, 5)):
        delays = [controls.backoff(retry, jitter=rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


# Concurrency ---------------------------------------------------------------------------------


def test_slots_are_taken_up_to_the_limit_freed_and_lapse_with_a_lost_lease():
    from datetime import timedelta

    from mcptasks.models import ToolSlot
    from mcptasks.tasks import slots

    assert slots.take("limited", 2, task_id="t1", worker="w1") == 0
    assert slots.take("limited", 2, task_id="t2", worker="w2") == 1
    assert slots.take("limited", 2, task_id="t3", worker="w3") is None
    assert slots.held("limited") == 2
    slots.free("w1")
    assert slots.take("limited", 2, task_id="t3", worker="w3") == 0
    # A holder that died: its slot lapses with the lease it no longer renews.
    ToolSlot.objects.filter(worker="w2").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert slots.take("limited", 2, task_id="t4", worker="w4") == 1
    renewed_before = ToolSlot.objects.get(worker="w4").expires_at
    slots.renew(["w4"])
    assert ToolSlot.objects.get(worker="w4").expires_at >= renewed_before
    # Another tool's slots are its own.
    assert slots.take("other", 1, task_id="t5", worker="w5") == 0


def test_a_run_over_the_limit_waits_without_claiming_and_runs_once_a_slot_frees(temp_tool):
    from mcptasks.tasks import slots

    @temp_tool(task="required", concurrency=1)
    def one_at_a_time() -> str:
        return "done"

    assert slots.take("one_at_a_time", 1, task_id="elsewhere", worker="other-run") == 0
    task = new_task("one_at_a_time")
    assert run_task(task.id) == "waiting"
    waiting = get(task)
    assert waiting.status == TaskStatus.WORKING and waiting.attempts == 0 and waiting.lease_owner == ""
    assert waiting.status_message == "Waiting for a free slot: at most 1 runs of one_at_a_time at once."
    assert waiting.dispatched_at > timezone.now()
    assert not TaskEvent.objects.filter(task=task, kind="run_started").exists()
    with mcp_settings(DISPATCH_GRACE_SECONDS=0.01):
        assert lifecycle.sweep().redispatched == 0  # a wait is not a lost run
    slots.free("other-run")
    assert run_task(task.id) == "completed"
    assert get(task).status == TaskStatus.COMPLETED
    assert slots.held("one_at_a_time") == 0  # given back at the end


def test_the_limited_tools_follow_registrations_and_the_sites_setting(temp_tool):
    """A run asks before each claim which tools take a slot; the answer is kept, so it must
    change as soon as a tool is registered or removed, or ``TOOL_CONTROLS`` changes."""
    from mcptasks.tools import effective

    assert "later_limited" not in effective.limited_tools()

    @temp_tool(task="required", concurrency=2)
    def later_limited() -> str:
        return "done"

    assert "later_limited" in effective.limited_tools()
    with mcp_settings(TOOL_CONTROLS={"later_limited": {"concurrency": None}, "slow_compute": {"concurrency": 1}}):
        assert {"slow_compute"} <= effective.limited_tools() and "later_limited" not in effective.limited_tools()
    assert "later_limited" in effective.limited_tools() and "slow_compute" not in effective.limited_tools()
    registry.unregister("later_limited")
    assert "later_limited" not in effective.limited_tools()


def test_a_waiting_run_of_a_cancelled_task_stops_waiting(temp_tool):
    from mcptasks.tasks import slots

    @temp_tool(task="required", concurrency=1)
    def single() -> str:
        return "done"

    slots.take("single", 1, task_id="elsewhere", worker="other-run")
    task = new_task("single")
    assert run_task(task.id) == "waiting"
    assert lifecycle.cancel(task.id, actor="client:alice")
    assert run_task(task.id) == "skipped"


def test_runs_taking_slots_at_once_never_get_more_than_the_limit():
    """Twelve runs (threads, each with its own connection, like workers on
    several hosts) take slots of a limit-3 tool at the same moment: three win."""
    from mcptasks.tasks import slots

    barrier = threading.Barrier(12)
    won: list[int] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        try:
            barrier.wait(10)
            got = slots.take("contended", 3, task_id=f"t{n}", worker=f"w{n}")
            if got is not None:
                with lock:
                    won.append(got)
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(won) == [0, 1, 2]
    assert slots.held("contended") == 3
