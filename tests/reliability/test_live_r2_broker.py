"""R2: the broker (Redis) goes away under load and comes back empty.

The stack runs on a Redis of its own, stopped with SIGKILL for a while (the
short form 8 s, the full form 30 s) while clients keep creating and polling
tasks, then started again without its data (no persistence: every queued
message is gone, as after a real Redis restart without AOF).

What must hold (see docs/reliability.md, "Broker outage"):

* a ``tools/call`` during the outage is answered with a CreateTaskResult:
  the task row is committed first, and its enqueue, which fails, is retried
  by the sweeper once the broker is back ("enqueued later"); a clean JSON-RPC
  error is the only other acceptable answer, never a 5xx page;
* every task answered with a CreateTaskResult finishes after Redis returns
  (lost = 0), including those whose messages Redis lost;
* no process is restarted, exits or stops consuming (none logs Celery's
  "Unrecoverable error"), and the audit trail stays legal.

Workers used to stop consuming here: kombu's Redis transport failed with
``AttributeError`` while closing a broken connection that held unacknowledged
messages, Celery took it as unrecoverable, and the process lived on without
consuming. ``mcptasks.worker.brokers`` turns that into a connection error, from which
Celery reconnects; this test is where that fix is held to account.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.reliability import audit
from tests.reliability.forms import FORMS, record_figures
from tests.reliability.load import Load
from tests.support import postgres_only
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.CHAOS]

FORM = {
    "short": {"before": 4.0, "outage": 8.0, "after": 4.0, "rate": 10.0},
    "full": {"before": 10.0, "outage": 30.0, "after": 10.0, "rate": 10.0},
}


@pytest.mark.parametrize("form", FORMS)
def test_r2_broker_outage(own_redis, chaos_stack_factory, form):
    plan = FORM[form]
    stack = chaos_stack_factory(redis_url=own_redis.url, workers=2, concurrency=3)
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    load = Load(
        stack.url,
        [None],
        rate=plan["rate"],
        creators=2,
        pollers=2,
        arguments=lambda r: {"seconds": round(r.uniform(0, 0.3), 3), "label": "r2"},
        seed=2,
    )
    load.start()
    try:
        time.sleep(plan["before"])
        down_at = time.monotonic()
        with load.tally.lock:
            created_before = len(load.tally.created)
        own_redis.stop()
        try:
            time.sleep(plan["outage"])
        finally:
            own_redis.start()
        up_at = time.monotonic()
        with load.tally.lock:
            created_during = load.tally.created[created_before:]
        time.sleep(plan["after"])
    finally:
        load.stop()
    created = load.created_ids()
    outage_ids = [task_id for _, task_id in created_during]
    stalled = None
    try:
        wait_until(lambda: audit.active_count(stack) == 0, timeout=60, what="every task finished after the outage")
    except AssertionError:
        stalled = f"{audit.active_count(stack)} tasks still active 60 s after Redis returned"
    recovered_at = time.monotonic()
    # A worker that stopped consuming says so in its log (and lives on).
    wedged = [name for name in stack.procs if "Unrecoverable error" in stack.log_text(name)]

    during = load.tally.during(down_at, up_at)
    calls_during = Counter({(s, c): n for (m, s, c), n in during.items() if m == "tools/call"})

    def slowest(method: str) -> float:
        timeline = load.tally.timeline
        return max((elapsed for t, m, _, _, elapsed in timeline if m == method and down_at <= t <= up_at), default=0)

    slowest_call, slowest_poll = slowest("tools/call"), slowest("tasks/get")
    report = audit.check_trail(stack)
    lost = audit.missing(stack, created)
    not_completed = stack.query("SELECT id, status, error FROM mcptasks_task WHERE status <> 'completed'")
    figures = {
        "outage_s": plan["outage"],
        "tasks_created": len(created),
        "created_during_outage": len(outage_ids),
        "calls_during_outage": {f"{s} {c}": n for (s, c), n in calls_during.items()},
        "slowest_call_during_outage_s": round(slowest_call, 2),
        "slowest_poll_during_outage_s": round(slowest_poll, 2),
        "seconds_to_drain_after_outage": None if stalled else round(recovered_at - up_at, 1),
        "stalled": stalled,
        "workers_wedged": wedged,
        "lost": len(lost),
        "illegal_transitions": len(report.violations),
        "processes_gone": sorted(
            name for name, proc in stack.procs.items() if proc.pid != pids.get(name) or proc.poll() is not None
        ),
        **report.summary(),
        "client": load.tally.summary(),
    }
    record_figures("R2 broker", form, figures)

    assert outage_ids, "no task was created while the broker was down"
    assert not load.tally.bad, f"answers no client may get: {load.tally.bad[:5]}"
    assert set(calls_during) <= {(200, None)}, f"tools/call during the outage: {dict(calls_during)}"
    assert not lost, f"promised tasks missing: {lost[:10]}"
    assert not wedged, f"workers that logged a Celery 'Unrecoverable error' (they stop consuming): {wedged}"
    assert stalled is None, f"{stalled}; no worker logged an unrecoverable error"
    assert not not_completed, f"tasks that did not complete: {not_completed[:10]}"
    assert not report.violations, f"illegal histories: {list(report.violations.items())[:5]}"
    assert not figures["processes_gone"], "nothing may exit or need restarting after a broker outage"
