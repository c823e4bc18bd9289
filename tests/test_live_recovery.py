"""A worker process dies mid-run (SIGKILL): the sweeper recovers the task.

The live stack runs with a 3 s lease and a 0.5 s heartbeat. The run's lease
owner (``host:pid:rand``) names the Celery pool process running it; killing
that process leaves the lease to lapse, and ``manage.py mcptasks sweep``
(what beat runs periodically) re-enqueues the task, or fails it once its
attempts are used up.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import pytest

from tests.support import postgres_only
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

TERMINAL = ("completed", "failed", "cancelled")


def lease_pid(lease_owner: str) -> int:
    return int(lease_owner.rsplit(":", 2)[1])


def wait_for_new_run(stack, task_id: str, not_owner: set[str], timeout: float = 20) -> dict:
    """Until the task is terminal or held by a run not in ``not_owner``."""

    def new_run() -> dict | None:
        row = stack.task_row(task_id)
        if row["status"] in TERMINAL or (row["lease_owner"] and row["lease_owner"] not in not_owner):
            return row
        return None

    return wait_until(
        new_run,
        timeout,
        interval=0.02,
        what=f"a new run of {task_id}",
        explain=lambda: f"{stack.task_row(task_id)}\n{stack.logs()}",
    )


def kill_run(stack, row: dict) -> int:
    pid = lease_pid(row["lease_owner"])
    assert pid in stack.worker_pids(), f"lease owner {row['lease_owner']} is not a pool process of our worker"
    os.kill(pid, signal.SIGKILL)
    return pid


def sweep_until(stack, task_id: str, done, timeout: float = 40) -> dict:
    """Run the sweeper whenever the lease has lapsed, until ``done(row)``."""
    sweeps = 0

    def recovered() -> dict | None:
        nonlocal sweeps
        row = stack.task_row(task_id)
        if done(row):
            return row
        lapsed = row["lease_expires_at"] is not None and row["lease_expires_at"] < datetime.now(UTC)
        if row["status"] == "working" and lapsed:
            out = stack.manage("mcptasks", "sweep").stdout
            sweeps += 1
            assert "sweep:" in out
        return None

    return wait_until(
        recovered,
        timeout,
        interval=0.2,
        what=f"{task_id} recovered",
        explain=lambda: f"after {sweeps} sweeps: {stack.task_row(task_id)}\n{stack.logs()}",
    )


def test_killed_run_is_rerun_to_completion(live, live_stack):
    task_id = live.create_task("slow_compute", {"seconds": 5, "label": "survivor"})
    first = wait_for_new_run(live_stack, task_id, set())
    assert first["status"] == "working"
    killed = kill_run(live_stack, first)
    killed_at = time.monotonic()

    rerun = sweep_until(live_stack, task_id, lambda r: r["lease_owner"] not in ("", first["lease_owner"]))
    assert lease_pid(rerun["lease_owner"]) != killed
    final = live.wait_for(task_id, timeout=20)
    print(f"\nrecovered and completed {time.monotonic() - killed_at:.1f}s after SIGKILL")
    assert final["status"] == "completed"
    assert "survivor" in final["result"]["content"][0]["text"]

    # The second run comes from the sweeper's redispatch (a ``redispatched``
    # event) or from Celery's own redelivery of the lost message
    # (``reject_on_worker_lost``), whichever finds the lease lapsed first: the
    # claim's guard lets only one of them run it, and only once the lease lapsed.
    kinds = [e["kind"] for e in live_stack.events(task_id)]
    assert kinds.count("run_started") >= 2
    terminal = [e for e in live_stack.events(task_id) if e["to_status"] in TERMINAL]
    assert [(e["from_status"], e["to_status"]) for e in terminal] == [("working", "completed")]


def test_task_that_keeps_losing_its_worker_fails(live, live_stack):
    max_attempts = int(live_stack.env["MCP_MAX_ATTEMPTS"])
    task_id = live.create_task("slow_compute", {"seconds": 60, "label": "doomed"})
    seen: set[str] = set()
    kills = 0
    while True:
        row = wait_for_new_run(live_stack, task_id, seen)
        if row["status"] in TERMINAL:
            break
        assert kills <= max_attempts, f"still running after {kills} lost runs: {row}"
        seen.add(row["lease_owner"])
        kill_run(live_stack, row)
        kills += 1
        row = sweep_until(
            live_stack,
            task_id,
            lambda r, held=row["lease_owner"]: r["status"] in TERMINAL or r["lease_owner"] != held,
        )
        if row["status"] in TERMINAL:
            break

    final = live.tasks_get(task_id).result
    print(f"\nfailed after {kills} lost runs: {final.get('error')}")
    assert final["status"] == "failed"
    assert kills == max_attempts
    assert final["error"]["code"] == -32603
    message = final["error"]["message"].lower()
    assert "lost" in message or "abandoned" in message
    assert str(max_attempts) in final["error"]["message"]
    assert final.get("statusMessage")
    assert "result" not in final


def test_web_process_crash_loses_nothing(live, live_stack):
    """The web process holds no task state: after a SIGKILL and a restart,
    a task created before the crash is still there and finishes."""
    task_id = live.create_task("slow_compute", {"seconds": 3, "label": "across-restart"})
    live_stack.crash("web")
    live_stack.restart("web")
    final = live.wait_for(task_id, timeout=30)
    assert final["status"] == "completed"
    assert "across-restart" in final["result"]["content"][0]["text"]


def test_whole_worker_crash_is_recovered_by_a_new_worker(live, live_stack):
    """SIGKILL the Celery main process and its pool (the message stays
    unacknowledged in Redis); a new worker plus the sweeper finish the task."""
    task_id = live.create_task("slow_compute", {"seconds": 4, "label": "new-worker"})
    first = wait_for_new_run(live_stack, task_id, set())
    live_stack.crash("worker0")
    live_stack.restart("worker0")
    row = sweep_until(
        live_stack, task_id, lambda r: r["lease_owner"] not in ("", first["lease_owner"]) or r["status"] in TERMINAL
    )
    assert row["status"] != "failed", row
    final = live.wait_for(task_id, timeout=30)
    assert final["status"] == "completed"
    assert "new-worker" in final["result"]["content"][0]["text"]
