"""R1: workers die and the web process restarts while tasks are being created.

Clients create tasks (and poll them) at a steady rate; every few seconds a
random tool-worker process gets SIGKILL (usually a pool process running a
tool, sometimes a worker's main process, which its supervisor restarts); the
web process is restarted twice (once gracefully, once with SIGKILL). Then:

* lost = 0: every task id a client was given has a row;
* every row ends terminal (or is ``working`` under a live lease);
* stuck = 0: sampled every half second through the run, no lease stays
  lapsed, and no dispatch stays unclaimed past the grace period, for longer
  than the sweeper needs to notice (10 s of slack on a busy machine);
* the audit trail of every task is a legal lifecycle;
* a task fails only when its runs were lost MAX_ATTEMPTS times (abandoned).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter

import pytest

from tests.reliability import audit
from tests.reliability.forms import FORMS, record_figures
from tests.reliability.load import Load
from tests.reliability.stack import CHAOS_SETTINGS
from tests.support import postgres_only
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.CHAOS]

FORM = {
    "short": {"tasks": 200, "kill_every": 2.0, "workers": 2, "concurrency": 3, "rate": 20.0, "max_seconds": 0.4},
    "full": {"tasks": 2000, "kill_every": 5.0, "workers": 2, "concurrency": 5, "rate": 10.0, "max_seconds": 1.0},
}
LEASE = float(CHAOS_SETTINGS["MCP_LEASE_SECONDS"])
#: Longer than the chaos stacks' 3 s: under load a message may wait in the
#: queue for several seconds, and below that wait the sweeper re-enqueues
#: tasks that are merely queued (harmless duplicates, but a flood of them).
GRACE = 10.0
#: How late a recovery may be before a task counts as stuck: the lease or the
#: grace period, plus a sweep, plus slack for a busy two-core machine.
SLACK = 10.0


@pytest.mark.parametrize("form", FORMS)
def test_r1_workers_killed_and_web_restarted(chaos_stack_factory, form):
    plan = FORM[form]
    rng = random.Random(1)
    stack = chaos_stack_factory(
        workers=plan["workers"],
        concurrency=plan["concurrency"],
        settings={"MCP_DISPATCH_GRACE_SECONDS": str(GRACE)},
    )
    tokens = list(stack.create_tokens(["r1-a", "r1-b", "r1-c"]).values())
    load = Load(
        stack.url,
        [*tokens, None],
        target=plan["tasks"],
        rate=plan["rate"],
        creators=4,
        pollers=2,
        arguments=lambda r: {"seconds": round(r.uniform(0, plan["max_seconds"]), 3), "label": "r1"},
        seed=1,
    )
    kills: Counter = Counter()
    samples: list[tuple[float, float, int]] = []  # (lease overdue s, unclaimed wait s, stuck rows)
    stop = threading.Event()

    def chaos() -> None:
        next_kill = time.monotonic() + plan["kill_every"]
        while not stop.is_set():
            stack.supervise()
            if time.monotonic() >= next_kill:
                next_kill += plan["kill_every"]
                role = stack.kill_random_worker_process(rng)
                if role:
                    kills[role.split(":")[1]] += 1
            try:
                stuck = audit.stuck_tasks(stack, lease_slack=SLACK, dispatch_slack=GRACE + SLACK)
                samples.append((audit.overdue_seconds(stack), audit.oldest_unclaimed_seconds(stack), len(stuck)))
            except Exception:  # the database is not under test here; never stop the chaos
                pass
            stop.wait(0.5)

    started = time.monotonic()
    load.start()
    chaos_thread = threading.Thread(target=chaos, name="r1-chaos", daemon=True)
    chaos_thread.start()
    try:
        # Two web restarts while the clients create: a graceful one, then a crash.
        creation_time = plan["tasks"] / plan["rate"]
        time.sleep(creation_time / 3)
        stack.restart_web(signal.SIGTERM)
        time.sleep(creation_time / 3)
        stack.restart_web(signal.SIGKILL)
        load.wait_created(timeout=creation_time * 4 + 60)
        created_at = time.monotonic()
        # Keep killing while the backlog drains, then let the survivors finish.
        wait_until(lambda: audit.active_count(stack) == 0, timeout=60 + plan["tasks"] * 0.2, what="all tasks done")
    finally:
        stop.set()
        chaos_thread.join(10)
        load.stop()
    finished = time.monotonic()

    created = load.created_ids()
    report = audit.check_trail(stack)
    lost = audit.missing(stack, created)
    leftovers = stack.query(
        "SELECT id, status, lease_expires_at FROM mcptasks_task WHERE status IN ('working', 'input_required') "
        "AND NOT (status = 'working' AND lease_expires_at > now())"
    )
    unexpected_failures = stack.query(
        "SELECT id, error FROM mcptasks_task WHERE status = 'failed' AND error->>'message' NOT LIKE %s",
        ("%abandoned%",),
    )
    wrong_results = stack.query(
        "SELECT id, result FROM mcptasks_task WHERE status = 'completed' "
        "AND (result->>'isError' = 'true' OR result->'content'->0->>'text' NOT LIKE 'computed r1%%')"
    )
    figures = {
        "tasks_created": len(created),
        "rows": report.tasks,
        "unknown_creates": load.tally.unknown_creates,
        "kills": dict(kills),
        "web_restarts": stack.restarts.get("web", 0),
        "worker_restarts": sum(n for name, n in stack.restarts.items() if name.startswith("worker")),
        "lost": len(lost),
        "stuck_max": max((n for _, _, n in samples), default=0),
        "lease_overdue_max_s": round(max((o for o, _, _ in samples), default=0.0), 1),
        "unclaimed_wait_max_s": round(max((w for _, w, _ in samples), default=0.0), 1),
        "illegal_transitions": len(report.violations),
        "seconds_creating": round(created_at - started),
        "seconds_total": round(finished - started),
        **report.summary(),
        "client": load.tally.summary(),
    }
    record_figures("R1 workers", form, figures)

    assert stack.restarts.get("web", 0) == 2
    assert sum(kills.values()) >= 3, f"too few kills to mean anything: {kills}"
    assert len(created) == plan["tasks"], figures
    assert not lost, f"tasks answered with a CreateTaskResult but missing: {lost[:10]}"
    assert not leftovers, f"active tasks without a live lease after the run: {leftovers[:10]}"
    worst = max(samples, key=lambda sample: sample[2], default=None)
    assert figures["stuck_max"] == 0, f"tasks stuck past their lease or grace period (worst sample {worst})"
    assert not report.violations, f"illegal histories: {list(report.violations.items())[:5]}"
    assert not unexpected_failures, f"tasks failed for another reason than lost runs: {unexpected_failures[:5]}"
    assert not wrong_results, f"completed with a wrong result: {wrong_results[:5]}"
    assert report.by_status["completed"] + report.abandoned == report.tasks, figures
    assert not load.tally.bad, f"answers no client may get: {load.tally.bad[:5]}"
