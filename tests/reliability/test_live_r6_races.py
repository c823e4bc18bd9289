"""R6: races on the same tasks, end to end on Postgres.

Many client threads (two identities) race ``tasks/update`` and
``tasks/cancel`` over HTTP on the same tasks while Celery workers run them
and two sweepers (beat every second, and a process that sweeps every 20 ms)
take lapsed leases away. Leases are short (1.5 s, heartbeat 0.3 s), so on a
busy machine the sweeper does steal runs from live workers: the stale run
must then be unable to finish the task.

Two kinds of task:

* ``multi_input`` (asks two questions at once): every racer answers, some
  with both keys, some with one, some twice; a third of the tasks also get a
  cancel at a random moment; the other identity tries to answer and cancel
  them too (and must change nothing);
* ``slow_compute``: cancels fired around the moment the run completes.

Then, from the database alone: every history is a legal lifecycle with one
terminal transition; every answer was applied at most once (no key in two
``input`` events) and none was lost (a task that was not cancelled completed,
with exactly the answers stored in its rows); a cancelled task withdrew its
pending questions.
"""

from __future__ import annotations

import random
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.reliability import audit
from tests.reliability.forms import FORMS, record_figures
from tests.support import postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.CHAOS]

FORM = {
    "short": {"answer_tasks": 24, "cancel_tasks": 24, "racers": 4, "threads": 12},
    "full": {"answer_tasks": 240, "cancel_tasks": 240, "racers": 6, "threads": 24},
}
RACE_SETTINGS = {
    "MCP_LEASE_SECONDS": "1.5",
    "MCP_HEARTBEAT_SECONDS": "0.3",
    "MCP_DISPATCH_GRACE_SECONDS": "1",
    "MCP_SWEEP_SECONDS": "1",
    "MCP_MAX_ATTEMPTS": "50",
}
HOT_SWEEPER = "import time\nfrom mcptasks import lifecycle\nwhile True:\n    lifecycle.sweep()\n    time.sleep(0.02)\n"
RESULT = re.compile(r"^Got (.*) and (.*)\.$")


def accept(name: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"name": name}}


class Clients:
    """One HTTP client per (thread, identity): httpx clients are not shared."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.url = url
        self.tokens = tokens
        self.local = threading.local()
        self.made: list[HttpRpc] = []
        self.lock = threading.Lock()
        self.answers: Counter = Counter()
        self.bad: list[Any] = []
        self.retries = 0

    def get(self, who: str) -> HttpRpc:
        clients = self.local.__dict__.setdefault("clients", {})
        if who not in clients:
            clients[who] = HttpRpc(self.url, token=self.tokens[who], validate=False, timeout=30)
            with self.lock:
                self.made.append(clients[who])
        return clients[who]

    def call(self, who: str, method: str, params: dict[str, Any]) -> Any:
        """One request; a kept-alive connection the server closed as we reused
        it is retried once on a new one (every request here may be repeated:
        a second cancel or a second answer changes nothing)."""
        try:
            reply = self.get(who).request(method, params)
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
            with self.lock:
                self.retries += 1
            reply = self.get(who).request(method, params)
        return reply

    def note(self, method: str, reply: Any) -> Any:
        code = reply.body.get("error", {}).get("code") if isinstance(reply.body, dict) else None
        with self.lock:
            self.answers[(method, reply.status, code)] += 1
            if reply.status >= 500 or not isinstance(reply.body, dict):
                self.bad.append((method, reply.status, reply.raw[:200]))
        return reply

    def close(self) -> None:
        for client in self.made:
            client.close()


@pytest.mark.parametrize("form", FORMS)
def test_r6_update_cancel_completion_and_sweeper_race(chaos_stack_factory, form):
    plan = FORM[form]
    rng = random.Random(6)
    stack = chaos_stack_factory(workers=2, concurrency=4, settings=RACE_SETTINGS)
    stack.start("hot-sweeper", [sys.executable, "manage.py", "shell", "-c", HOT_SWEEPER])
    tokens = stack.create_tokens(["r6-a", "r6-b"])
    owners = {who: stack.shell(_owner_of(name)) for who, name in (("a", "r6-a"), ("b", "r6-b"))}
    clients = Clients(stack.url, {"a": tokens["r6-a"], "b": tokens["r6-b"]})
    try:
        # Tasks that wait for two answers, half for each identity.
        answer_tasks: dict[str, str] = {}
        for i in range(plan["answer_tasks"]):
            who = "ab"[i % 2]
            answer_tasks[clients.get(who).create_task("multi_input", {})] = who
        wait_until(
            lambda: (
                stack.query(
                    "SELECT count(*) AS n FROM mcptasks_task "
                    "WHERE tool_name = 'multi_input' AND status = 'input_required'"
                )[0]["n"]
                == len(answer_tasks)
            ),
            timeout=60 + len(answer_tasks) / 2,
            what="every multi_input task waiting for input",
        )
        to_cancel = set(rng.sample(sorted(answer_tasks), len(answer_tasks) // 3))
        sent: dict[tuple[str, str], set[str]] = defaultdict(set)

        def answer(task_id: str, who: str, racer: int, keys: tuple[str, ...]) -> None:
            responses = {key: accept(f"{task_id[:6]}-{key}-r{racer}") for key in keys}
            for key in keys:
                with clients.lock:
                    sent[(task_id, key)].add(responses[key]["content"]["name"])
            reply = clients.call(who, "tasks/update", {"taskId": task_id, "inputResponses": responses})
            clients.note("tasks/update", reply)

        def cancel(task_id: str, who: str, delay: float) -> None:
            time.sleep(delay)
            clients.note("tasks/cancel", clients.call(who, "tasks/cancel", {"taskId": task_id}))

        def intrude(task_id: str, other: str) -> None:
            answers = {"first": accept("intruder"), "second": accept("x")}
            reply = clients.call(other, "tasks/update", {"taskId": task_id, "inputResponses": answers})
            clients.note("foreign tasks/update", reply)
            clients.note("foreign tasks/cancel", clients.call(other, "tasks/cancel", {"taskId": task_id}))

        operations: list[tuple[Any, ...]] = []
        for task_id, who in answer_tasks.items():
            other = "b" if who == "a" else "a"
            for racer in range(plan["racers"]):
                keys = rng.choice([("first", "second"), ("first",), ("second",), ("second", "first")])
                operations.append((answer, task_id, who, racer, keys))
            operations.append((answer, task_id, who, plan["racers"], ("first", "second")))  # someone answers all
            operations.append((intrude, task_id, other))
            if task_id in to_cancel:
                operations.append((cancel, task_id, who, rng.uniform(0, 0.5)))
        # Tasks whose cancel races their completion.
        cancel_tasks: dict[str, str] = {}
        for i in range(plan["cancel_tasks"]):
            who = "ab"[i % 2]
            seconds = round(rng.uniform(1.0, 2.5), 3)
            task_id = clients.get(who).create_task("slow_compute", {"seconds": seconds, "label": "r6"})
            cancel_tasks[task_id] = who
            operations.append((cancel, task_id, who, rng.uniform(0, 2.5)))
        rng.shuffle(operations)
        started = time.monotonic()
        with ThreadPoolExecutor(plan["threads"]) as pool:
            for future in [pool.submit(op[0], *op[1:]) for op in operations]:
                future.result()
        wait_until(lambda: audit.active_count(stack) == 0, timeout=120, what="every task terminal")
        elapsed = time.monotonic() - started
    finally:
        clients.close()

    report = audit.check_trail(stack)
    problems: list[str] = []
    inputs = stack.query(
        "SELECT t.id, t.status, t.owner, t.result, r.key, r.state, r.response FROM mcptasks_task t "
        "JOIN mcptasks_inputrequest r ON r.task_id = t.id WHERE t.tool_name = 'multi_input'"
    )
    events = stack.query(
        "SELECT task_id, detail, actor FROM mcptasks_taskevent WHERE kind = 'input' ORDER BY task_id, at, id"
    )
    applied: dict[tuple[str, str], int] = Counter()
    for event in events:
        for key in event["detail"].get("keys", []):
            applied[(event["task_id"], key)] += 1
        if event["actor"] != f"client:{owners[answer_tasks.get(event['task_id'], 'a')]}":
            problems.append(f"an answer recorded for {event['task_id']} by {event['actor']}")
    rows: dict[str, dict[str, Any]] = defaultdict(dict)
    status: dict[str, str] = {}
    results: dict[str, Any] = {}
    for row in inputs:
        rows[row["id"]][row["key"]] = row
        status[row["id"]] = row["status"]
        results[row["id"]] = row["result"]
    outcome = Counter()
    for task_id in answer_tasks:
        keys = rows[task_id]
        if set(keys) != {"first", "second"}:
            problems.append(f"{task_id}: questions {sorted(keys)}")
            continue
        for key, row in keys.items():
            if applied[(task_id, key)] > 1:
                problems.append(f"{task_id}/{key} applied {applied[(task_id, key)]} times")
            if row["state"] == "answered":
                name = row["response"]["content"]["name"]
                if name not in sent[(task_id, key)]:
                    problems.append(f"{task_id}/{key}: stored answer {name!r} was never sent by its owner")
                if applied[(task_id, key)] != 1:
                    problems.append(f"{task_id}/{key}: answered but no input event names it")
            elif row["state"] == "pending":
                problems.append(f"{task_id}/{key} still pending after the task ended ({status[task_id]})")
        outcome[status[task_id]] += 1
        if status[task_id] == "completed":
            match = RESULT.match(results[task_id]["content"][0]["text"])
            stored = tuple(keys[k]["response"]["content"]["name"] for k in ("first", "second"))
            if not match or match.groups() != stored:
                problems.append(f"{task_id}: the tool saw {match and match.groups()}, the rows hold {stored}")
        elif status[task_id] == "cancelled":
            if task_id not in to_cancel:
                problems.append(f"{task_id} cancelled, but only its owner could and did not")
        else:
            problems.append(f"{task_id} ended {status[task_id]}")
    cancel_outcome = Counter(
        row["status"]
        for row in stack.query("SELECT status FROM mcptasks_task WHERE id = ANY(%s)", (list(cancel_tasks),))
    )
    foreign = {k: n for k, n in clients.answers.items() if k[0].startswith("foreign")}
    figures = {
        "tasks": report.tasks,
        "operations": len(operations),
        "seconds": round(elapsed, 1),
        "answer_tasks": dict(outcome),
        "cancel_vs_completion": dict(cancel_outcome),
        "answers_applied": sum(applied.values()),
        "answers_sent": sum(len(v) for v in sent.values()),
        "illegal_transitions": len(report.violations),
        "problems": len(problems),
        "client_retries": clients.retries,
        "client_answers": {f"{m} {s} {c}": n for (m, s, c), n in sorted(clients.answers.items(), key=str)},
        **report.summary(),
    }
    record_figures("R6 races", form, figures)

    assert not clients.bad, f"server errors: {clients.bad[:5]}"
    assert set(foreign) <= {("foreign tasks/update", 200, -32602), ("foreign tasks/cancel", 200, -32602)}, foreign
    assert not report.violations, f"illegal histories: {list(report.violations.items())[:5]}"
    assert not problems, "\n".join(problems[:30])
    assert set(cancel_outcome) <= {"completed", "cancelled"}, cancel_outcome


def _owner_of(username: str) -> str:
    return (
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from mcptasks.web.identity import owner_for\n"
        f"print(json.dumps(owner_for(get_user_model().objects.get(username={username!r}))))\n"
    )
