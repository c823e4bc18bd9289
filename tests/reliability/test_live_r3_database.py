"""R3: Postgres restarts under load.

The stack runs on a Postgres cluster of its own, with persistent connections
as the example site configures them (``CONN_MAX_AGE`` 300 with health
checks), so every process holds connections that the restart breaks. Clients
keep creating and polling tasks, anonymously and with bearer tokens (whose
check reads the database too). The cluster stops (``pg_ctl stop -m fast``:
sessions are terminated), stays down for a while, and starts again.

What must hold:

* while it is down, every answer that needs the database is a clean JSON-RPC
  error, code -32603 with HTTP 503, never a 500 page or a dropped connection;
* the system heals by itself: no process is restarted, requests succeed
  again within seconds, and every task answered with a CreateTaskResult
  finishes (lost = 0), with a legal audit trail.
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
    "short": {"before": 4.0, "outage": 5.0, "after": 6.0, "restarts": 1},
    "full": {"before": 10.0, "outage": 20.0, "after": 15.0, "restarts": 2},
}
#: Seconds after the database is back within which requests must succeed again.
HEAL_WITHIN = 10.0


@pytest.mark.parametrize("form", FORMS)
def test_r3_database_restart(own_postgres, chaos_stack_factory, form):
    plan = FORM[form]
    stack = chaos_stack_factory(
        database_url=own_postgres.url, workers=2, concurrency=3, settings={"CONN_MAX_AGE": "300"}
    )
    tokens = list(stack.create_tokens(["r3-a", "r3-b"]).values())
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    load = Load(
        stack.url,
        [*tokens, None],
        rate=12.0,
        creators=3,
        pollers=3,
        arguments=lambda r: {"seconds": round(r.uniform(0, 0.5), 3), "label": "r3"},
        seed=3,
    )
    outages: list[tuple[float, float]] = []
    load.start()
    try:
        for _ in range(plan["restarts"]):
            time.sleep(plan["before"])
            down_at = time.monotonic()
            try:
                own_postgres.stop("fast")
                time.sleep(plan["outage"])
            finally:
                own_postgres.start()
            outages.append((down_at, time.monotonic()))
        time.sleep(plan["after"])
    finally:
        load.stop()
    created = load.created_ids()
    wait_until(
        lambda: audit.active_count(stack) == 0,
        timeout=90,
        what="every task finished after the restart",
        explain=lambda: audit.stuck_report(stack),
    )

    during: Counter = Counter()
    for start, end in outages:
        during.update(load.tally.during(start, end))
    # Healed: the first success after each outage, and anything but success afterwards.
    heal_times = []
    failures_after = Counter()
    for index, (_, up) in enumerate(outages):
        until = outages[index + 1][0] if index + 1 < len(outages) else float("inf")
        later = [(t, m, s, c) for t, m, s, c, _ in load.tally.timeline if up < t < until]
        first_ok = next((t for t, _, s, _ in later if s == 200), None)
        heal_times.append(None if first_ok is None else round(first_ok - up, 2))
        failures_after.update((m, s, c) for t, m, s, c in later if t > up + HEAL_WITHIN and s != 200)
    report = audit.check_trail(stack)
    lost = audit.missing(stack, created)
    not_completed = stack.query("SELECT id, status, error FROM mcptasks_task WHERE status <> 'completed'")
    gone = sorted(name for name, proc in stack.procs.items() if proc.pid != pids[name] or proc.poll() is not None)
    figures = {
        "restarts": plan["restarts"],
        "outage_s": plan["outage"],
        "tasks_created": len(created),
        "answers_during_outage": {f"{m} {s} {c}": n for (m, s, c), n in sorted(during.items(), key=str)},
        "seconds_to_first_success": heal_times,
        "failures_after_healing": {f"{m} {s} {c}": n for (m, s, c), n in failures_after.items()},
        "lost": len(lost),
        "processes_gone": gone,
        "illegal_transitions": len(report.violations),
        **report.summary(),
        "client": load.tally.summary(),
    }
    record_figures("R3 database", form, figures)

    assert not load.tally.bad, f"answers no client may get (500 pages, non-JSON-RPC bodies): {load.tally.bad[:5]}"
    unclean = {key: n for key, n in during.items() if key[2] not in (None, -32603) or key[1] not in (200, 503)}
    assert not unclean, f"during the outage, answers other than success or 503/-32603: {unclean}"
    assert not load.tally.errors, f"connections broke: {dict(load.tally.errors)}"
    assert all(t is not None and t <= HEAL_WITHIN for t in heal_times), f"not healed: {heal_times}"
    assert not failures_after, f"errors after healing: {dict(failures_after)}"
    assert not gone, f"processes that died or had to be restarted: {gone}"
    assert not lost, f"promised tasks missing: {lost[:10]}"
    assert not not_completed, f"tasks that did not complete: {not_completed[:10]}"
    assert not report.violations, f"illegal histories: {list(report.violations.items())[:5]}"
