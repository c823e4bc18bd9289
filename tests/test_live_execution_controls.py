"""Per-tool execution controls on real Celery workers (Postgres + Redis):
each tool's runs on its own queue's worker, soft and hard time limits on a
prefork pool, retries with backoff, a queue nobody consumes, a concurrency
limit held across workers and a killed holder's slot coming back.

The stack's two workers (three pool processes each) consume a queue of their
own: ``worker0`` the site's run queue, ``worker1`` the "gpu" queue, which
``count_to`` is sent to; both consume the "shared" queue of ``limited_work``
(at most two at once). The queues and limits come from the site's
``TOOL_CONTROLS`` (``MCP_TOOL_CONTROLS`` here); ``flaky_call``'s retries from
its own ``@tool`` options.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.support import live, postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

SOFT_LIMIT = 1.0
HARD_LIMIT = 2.0
GUARDED_HARD_LIMIT = 4.0
LIMIT = 2


class ControlsStack(live.LiveStack):
    """Two workers, each on its own queue."""

    def queue_of(self, index: int) -> str:
        return self.queue if index == 0 else f"{self.queue}-gpu"

    @property
    def shared_queue(self) -> str:
        return f"{self.queue}-shared"

    def worker_argv(self, index: int) -> list[str]:
        queues = f"{self.queue_of(index)},{self.shared_queue}"
        return live.celery_worker_argv(queues, f"worker{index}-{self.queue}", concurrency=3, site=self.site)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlsStack]:
    made = live.new_stack(
        ControlsStack,
        tmp_path_factory.mktemp("controls-stack"),
        database_url=os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL),
        redis_url=os.environ.get("MCPTASKS_TEST_REDIS_URL", live.DEFAULT_REDIS_URL),
        settings=live.LIVE_SETTINGS,
        name="controls",
        workers=2,
    )
    made.env["MCP_TOOL_CONTROLS"] = json.dumps(
        {
            "count_to": {"queue": made.queue_of(1)},
            "guarded_wait": {"soft_time_limit": SOFT_LIMIT, "time_limit": GUARDED_HARD_LIMIT},
            "stubborn_wait": {"time_limit": HARD_LIMIT},
            "unreachable_api": {
                "retries": 3,
                "retry_on": ["builtins.ConnectionError"],
                "retry_backoff": 30,
                "retry_backoff_max": 30,
            },
            "maybe_slow": {"queue": f"{made.queue}-nobody"},
            "limited_work": {"queue": made.shared_queue, "concurrency": LIMIT},
        }
    )
    try:
        made.launch()
    except BaseException:
        live.teardown_stack(made)
        raise
    try:
        yield made
    finally:
        live.teardown_stack(made)


@pytest.fixture
def client(stack: ControlsStack) -> Iterator[HttpRpc]:
    rpc = HttpRpc(stack.url)
    try:
        yield rpc
    finally:
        rpc.close()


def run_pids(stack: ControlsStack, task_id: str) -> list[int]:
    """The pool process of each run of the task (from its ``run_started`` events' actors)."""
    return [int(e["actor"].rsplit(":", 2)[1]) for e in stack.events(task_id) if e["kind"] == "run_started"]


def seconds_between(first: datetime, then: datetime) -> float:
    return (then - first).total_seconds()


def text_of(final: dict[str, Any]) -> str:
    return " ".join(block.get("text", "") for block in final["result"]["content"])


def ran_for(stack: ControlsStack, task_id: str) -> float:
    """From the (last) run's start to the task's end, by the audit trail."""
    events = stack.events(task_id)
    started = [e["at"] for e in events if e["kind"] == "run_started"][-1]
    ended = [e["at"] for e in events if e["to_status"] in ("completed", "failed", "cancelled")][-1]
    return seconds_between(started, ended)


def test_each_tools_runs_land_only_on_its_queues_worker(stack: ControlsStack, client: HttpRpc) -> None:
    plain = [client.create_task("slow_compute", {"seconds": 0.2, "label": f"p{i}"}) for i in range(4)]
    gpu = [client.create_task("count_to", {"n": 2, "step_seconds": 0.1}) for _ in range(4)]
    for task_id in plain + gpu:
        assert client.wait_for(task_id, timeout=60)["status"] == "completed"
    roles = stack.worker_processes()
    plain_workers = {roles.get(pid, f"gone:{pid}") for task_id in plain for pid in run_pids(stack, task_id)}
    gpu_workers = {roles.get(pid, f"gone:{pid}") for task_id in gpu for pid in run_pids(stack, task_id)}
    print(f"\nslow_compute ran on {sorted(plain_workers)}; count_to ran on {sorted(gpu_workers)}")
    assert plain_workers == {"worker0:child"}
    assert gpu_workers == {"worker1:child"}
    queues = stack.manage("mcptasks", "queues").stdout
    assert f"count_to: {stack.queue_of(1)}" in queues and f"slow_compute: {stack.queue}" in queues


def test_the_soft_limit_is_told_and_the_tool_cleans_up(stack: ControlsStack, client: HttpRpc) -> None:
    task_id = client.create_task("guarded_wait", {"seconds": 30})
    final = client.wait_for(task_id, timeout=30)
    took = ran_for(stack, task_id)
    print(f"\nsoft limit {SOFT_LIMIT} s: ended {took:.2f} s after the run started")
    assert final["status"] == "completed" and final["result"]["isError"] is True
    assert f"soft time limit of {SOFT_LIMIT:g} s" in text_of(final)
    assert SOFT_LIMIT <= took <= SOFT_LIMIT + 1
    wait_until(lambda: f"guarded_wait {task_id}: cleaned up" in stack.log_text("worker0"), 10, what="the cleanup")


def test_a_tool_that_ignores_its_limits_is_stopped_at_the_hard_limit(stack: ControlsStack, client: HttpRpc) -> None:
    task_id = client.create_task("stubborn_wait", {"seconds": 60})
    final = client.wait_for(task_id, timeout=30)
    took = ran_for(stack, task_id)
    print(f"\nhard limit {HARD_LIMIT} s: ended {took:.2f} s after the run started")
    assert final["status"] == "completed" and final["result"]["isError"] is True
    assert f"time limit of {HARD_LIMIT:g} s" in text_of(final)
    assert HARD_LIMIT <= took <= HARD_LIMIT + 1
    # The prefork pool killed the process that still ran the tool.
    [pid] = run_pids(stack, task_id)
    wait_until(lambda: pid not in stack.worker_pids(), 15, what=f"pool process {pid} stopped")
    # The worker carries on with a fresh process.
    after = client.create_task("slow_compute", {"seconds": 0, "label": "after"})
    assert client.wait_for(after, timeout=30)["status"] == "completed"


def test_a_declared_exception_is_retried_with_backoff_until_it_succeeds(stack: ControlsStack, client: HttpRpc) -> None:
    task_id = client.create_task("flaky_call", {"succeed_on": 3})
    messages: set[str] = set()
    final = client.wait_for(
        task_id, timeout=60, on_poll=lambda r: messages.add(r.result.get("statusMessage") or ""), interval=0.05
    )
    assert final["status"] == "completed" and final["result"]["isError"] is False
    assert text_of(final) == "answered on attempt 3"
    events = stack.events(task_id)
    starts = [e["at"] for e in events if e["kind"] == "run_started"]
    retries = [e for e in events if e["kind"] == "tool_retry"]
    assert len(starts) == 3 and [r["detail"]["attempt"] for r in retries] == [2, 3]
    # flaky_call: retry_backoff=0.5, retry_backoff_max=1.0, jitter over each ceiling's upper half.
    for retry, ceiling, next_start in zip(retries, (0.5, 1.0), starts[1:], strict=True):
        delay = retry["detail"]["delay"]
        assert ceiling / 2 <= delay <= ceiling
        assert seconds_between(retry["at"], next_start) >= delay - 0.05
    print(f"\nbackoffs {[r['detail']['delay'] for r in retries]}; status messages seen: {sorted(messages)}")
    assert any(m.startswith("Attempt 2 at ") and "ConnectionError" in m for m in messages)
    assert stack.task_row(task_id)["attempts"] == 1  # no run was lost


def test_an_undeclared_exception_is_not_retried(stack: ControlsStack, client: HttpRpc) -> None:
    task_id = client.create_task("flaky_call", {"error": "KeyError"})
    final = client.wait_for(task_id, timeout=30)
    assert final["status"] == "completed" and final["result"]["isError"] is True
    assert "KeyError" in text_of(final)
    kinds = [e["kind"] for e in stack.events(task_id)]
    assert kinds.count("run_started") == 1 and "tool_retry" not in kinds


def test_cancelling_during_a_backoff_ends_the_task_at_once(stack: ControlsStack, client: HttpRpc) -> None:
    task_id = client.create_task("unreachable_api")
    waiting = wait_until(
        lambda: (r := client.tasks_get(task_id).result).get("statusMessage", "").startswith("Attempt 2") and r,
        30,
        interval=0.05,
        what="the first backoff",
    )
    assert waiting["status"] == "working"
    started = time.monotonic()
    assert client.tasks_cancel(task_id).status == 200
    final = client.wait_for(task_id, timeout=5, interval=0.02)
    print(f"\ncancelled {time.monotonic() - started:.2f} s into a backoff of ~15-30 s")
    assert final["status"] == "cancelled"
    assert time.monotonic() - started < 1
    assert [e["kind"] for e in stack.events(task_id)].count("run_started") == 1


def test_a_run_whose_queue_nobody_consumes_waits_and_is_not_taken_for_lost(
    stack: ControlsStack, client: HttpRpc
) -> None:
    task_id = client.create_task("maybe_slow", {"seconds": 0.1})
    grace = float(stack.env["MCP_DISPATCH_GRACE_SECONDS"])
    time.sleep(grace + 0.5)
    assert "re-enqueued 1" in stack.manage("mcptasks", "sweep").stdout
    row = stack.task_row(task_id)
    assert (row["status"], row["attempts"], row["started_at"]) == ("working", 0, None)
    # A worker for that queue picks it up: both messages reach it, one runs.
    nobody = f"{stack.queue}-nobody"
    stack.start("worker-nobody", live.celery_worker_argv(nobody, f"nobody-{stack.queue}", concurrency=1))
    final = client.wait_for(task_id, timeout=60)
    assert final["status"] == "completed"
    assert [e["kind"] for e in stack.events(task_id)].count("run_started") == 1


def work_spans(stack: ControlsStack) -> dict[str, list[float]]:
    """``limited_work``'s start and end times by task, from both workers' logs."""
    spans: dict[str, list[float]] = {}
    for name in ("worker0", "worker1"):
        for line in stack.log_text(name).splitlines():
            if "limited_work " in line and (" start " in line or " end " in line):
                task_id, _, at = line.split("limited_work ", 1)[1].split()[:3]
                spans.setdefault(task_id, []).append(float(at))
    return spans


def test_a_concurrency_limit_holds_across_workers_and_every_run_completes(
    stack: ControlsStack, client: HttpRpc
) -> None:
    tasks = [client.create_task("limited_work", {"seconds": 0.6}) for _ in range(10)]
    for task_id in tasks:
        assert client.wait_for(task_id, timeout=120)["status"] == "completed"
    spans = work_spans(stack)
    assert set(tasks) <= set(spans)
    assert all(len(spans[t]) == 2 for t in tasks), {t: spans[t] for t in tasks}
    # Every instant: the runs that started by then and had not ended.
    edges = sorted([(spans[t][0], 1) for t in tasks] + [(spans[t][1], -1) for t in tasks], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    hosts = {int(e["actor"].rsplit(":", 2)[1]) for t in tasks for e in stack.events(t) if e["kind"] == "run_started"}
    roles = stack.worker_processes()
    workers = {roles.get(pid, "gone").split(":")[0] for pid in hosts}
    print(f"\nat most {most} of 10 runs at once (limit {LIMIT}), on {len(hosts)} processes of {sorted(workers)}")
    assert most == LIMIT
    assert workers == {"worker0", "worker1"}


def test_a_killed_workers_slot_comes_back_within_the_lease(stack: ControlsStack, client: HttpRpc) -> None:
    lease = float(stack.env["MCP_LEASE_SECONDS"])
    holders = [client.create_task("limited_work", {"seconds": 60}) for _ in range(LIMIT)]
    wait_until(lambda: all((stack.task_row(t) or {}).get("lease_owner") for t in holders), 30, what="both slots held")
    waiter = client.create_task("limited_work", {"seconds": 0.1})
    wait_until(
        lambda: "Waiting for a free slot" in (client.tasks_get(waiter).result.get("statusMessage") or ""),
        30,
        what="the third run waiting",
    )
    victim = stack.task_row(holders[0])["lease_owner"]
    pid = int(victim.rsplit(":", 2)[1])
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()

    def slot_of_victim() -> list[dict[str, Any]]:
        return stack.query("SELECT * FROM mcptasks_toolslot WHERE worker = %s AND expires_at > now()", (victim,))

    wait_until(lambda: not slot_of_victim(), 30, interval=0.05, what="the killed run's slot freed")
    freed = time.monotonic() - killed
    # Taken again: by the waiter, or by the killed run's own redelivered message, whichever came first.
    wait_until(
        lambda: (
            len(stack.query("SELECT 1 FROM mcptasks_toolslot WHERE tool_name = 'limited_work' AND worker <> ''"))
            == LIMIT
            and not slot_of_victim()
        ),
        30,
        interval=0.05,
        what="the slot taken again",
    )
    retaken = time.monotonic() - killed
    print(f"\nthe killed run's slot: free {freed:.2f} s, taken again {retaken:.2f} s after SIGKILL (lease {lease:g} s)")
    assert freed <= lease + 0.5
    assert retaken <= lease + 1.5  # plus a waiting run's pause before its next try
    for task_id in holders:
        client.tasks_cancel(task_id)
    assert client.wait_for(waiter, timeout=30)["status"] == "completed"
