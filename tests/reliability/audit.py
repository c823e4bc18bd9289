"""Checks on a stack's database after a fault run: the audit trail obeys the
lifecycle, nothing was lost, nothing is stuck.

Everything here reads the rows directly (SQL through ``LiveStack.query``);
nothing trusts the server's answers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ACTIVE = frozenset({"working", "input_required"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})

#: Every edge the lifecycle allows ("" is creation).
LEGAL_EDGES = frozenset(
    {("", "working"), ("working", "input_required"), ("input_required", "working")}
    | {(a, t) for a in ACTIVE for t in TERMINAL}
)


@dataclass
class AuditReport:
    tasks: int = 0
    by_status: Counter = field(default_factory=Counter)
    #: task id -> what is wrong with its history
    violations: dict[str, str] = field(default_factory=dict)
    #: How many runs each task started (``run_started`` events): 1 is the norm.
    runs: Counter = field(default_factory=Counter)
    redispatched: int = 0
    abandoned: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "by_status": dict(self.by_status),
            "violations": len(self.violations),
            "runs_per_task": dict(sorted(self.runs.items())),
            "redispatched_events": self.redispatched,
            "abandoned": self.abandoned,
        }


def check_trail(stack: Any, task_ids: Iterable[str] | None = None) -> AuditReport:
    """Check every task's recorded transitions (or those of ``task_ids``).

    A history is legal when its status changes form one chain that starts with
    creation, uses only lifecycle edges, never leaves a terminal status, has
    at most one terminal transition, and ends where the row is.
    """
    wanted = None if task_ids is None else list(task_ids)
    where = "" if wanted is None else "WHERE t.id = ANY(%s)"
    params = None if wanted is None else (wanted,)
    rows = stack.query(f"SELECT t.id, t.status, t.error FROM mcptasks_task t {where}", params)
    events = stack.query(
        "SELECT e.task_id, e.kind, e.from_status, e.to_status FROM mcptasks_taskevent e "
        f"{'' if wanted is None else 'WHERE e.task_id = ANY(%s)'} ORDER BY e.task_id, e.at, e.id",
        params,
    )
    chains: dict[str, list[tuple[str, str]]] = defaultdict(list)
    runs: Counter = Counter()
    report = AuditReport(tasks=len(rows))
    for event in events:
        if event["to_status"]:
            chains[event["task_id"]].append((event["from_status"], event["to_status"]))
        if event["kind"] == "run_started":
            runs[event["task_id"]] += 1
        elif event["kind"] == "redispatched":
            report.redispatched += 1
    for row in rows:
        task_id, status = row["id"], row["status"]
        report.by_status[status] += 1
        report.runs[runs[task_id]] += 1
        if status == "failed" and "abandoned" in str((row["error"] or {}).get("message", "")):
            report.abandoned += 1
        problem = chain_problem(chains.get(task_id, []), status)
        if problem:
            report.violations[task_id] = problem
    return report


def chain_problem(chain: list[tuple[str, str]], status: str) -> str | None:
    if not chain or chain[0] != ("", "working"):
        return f"does not start with creation: {chain}"
    previous = ""
    terminal = 0
    for from_status, to_status in chain:
        if from_status != previous:
            return f"broken chain ({from_status} after {previous}): {chain}"
        if (from_status, to_status) not in LEGAL_EDGES:
            return f"illegal transition {from_status} -> {to_status}: {chain}"
        if to_status in TERMINAL:
            terminal += 1
        previous = to_status
    if terminal > 1:
        return f"{terminal} terminal transitions: {chain}"
    if previous != status:
        return f"history ends at {previous} but the row is {status}: {chain}"
    return None


def stuck_tasks(stack: Any, *, lease_slack: float, dispatch_slack: float) -> list[dict[str, Any]]:
    """Active tasks the sweeper should have recovered by now: ``working``
    with a lease that lapsed more than ``lease_slack`` seconds ago, or never
    claimed for ``dispatch_slack`` seconds since its last dispatch."""
    return stack.query(
        "SELECT id, status, lease_owner, lease_expires_at, dispatched_at, attempts, now() AS now "
        "FROM mcptasks_task WHERE status = 'working' AND ("
        "  lease_expires_at < now() - make_interval(secs => %s)"
        "  OR (lease_expires_at IS NULL"
        "      AND (dispatched_at IS NULL OR dispatched_at < now() - make_interval(secs => %s)))"
        ")",
        (lease_slack, dispatch_slack),
    )


def overdue_seconds(stack: Any) -> float:
    """How long ago the most overdue lease among ``working`` tasks lapsed (0 if none)."""
    rows = stack.query(
        "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(lease_expires_at)), 0) AS overdue "
        "FROM mcptasks_task WHERE status = 'working' AND lease_expires_at < now()"
    )
    return float(rows[0]["overdue"] or 0)


def oldest_unclaimed_seconds(stack: Any) -> float:
    """How long the longest-waiting ``working`` task without a lease has
    waited since its last dispatch (queue wait, or a lost message)."""
    rows = stack.query(
        "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(dispatched_at)), 0) AS waited "
        "FROM mcptasks_task WHERE status = 'working' AND lease_expires_at IS NULL"
    )
    return float(rows[0]["waited"] or 0)


def missing(stack: Any, task_ids: Iterable[str]) -> list[str]:
    """Ids the server handed out that have no row."""
    ids = list(dict.fromkeys(task_ids))
    if not ids:
        return []
    found = {r["id"] for r in stack.query("SELECT id FROM mcptasks_task WHERE id = ANY(%s)", (ids,))}
    return [i for i in ids if i not in found]


def stuck_report(stack: Any, limit: int = 5) -> str:
    """The tasks still active, with their lease and history, and the tail of
    every process's log: what a failed wait for them to finish must say."""
    rows = stack.query(
        "SELECT id, status, attempts, lease_owner, lease_expires_at, dispatched_at, updated_at, now() AS now"
        " FROM mcptasks_task WHERE status IN ('working', 'input_required') ORDER BY updated_at LIMIT %s",
        (limit,),
    )
    lines = [f"{active_count(stack)} tasks still active; the oldest:"]
    for row in rows:
        lines.append(f"  {row}")
        events = stack.query(
            "SELECT at, kind, from_status, to_status, actor, detail FROM mcptasks_taskevent"
            " WHERE task_id = %s ORDER BY at, id",
            (row["id"],),
        )
        lines += [f"    {event}" for event in events]
    return "\n".join(lines) + "\n" + stack.logs()


def active_count(stack: Any) -> int:
    return int(
        stack.query("SELECT count(*) AS n FROM mcptasks_task WHERE status IN ('working', 'input_required')")[0]["n"]
    )
