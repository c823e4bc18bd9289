"""Coalesced status reports (mcptasks.worker.progress): a run's reports
return at once, its row is written at most once per
``STATUS_INTERVAL_SECONDS``, and nothing of them lands after the run's next
durable write.

The UPDATEs of a task's row are counted by Postgres itself: a trigger,
installed for the test, records each one as it happens. The runs are real
``run_task`` runs on committed rows, with the process's writer thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from mcptasks import ToolContext, signals
from mcptasks.models import Task, TaskStatus
from mcptasks.tasks import lifecycle
from mcptasks.tools.context import progress_text
from mcptasks.worker.execution import run_task
from mcptasks.worker.progress import RunStatus
from tests.support import postgres_only
from tests.support.factories import WORKER, make_task, running_task
from tests.support.rpc import FULL_CAPS
from tests.support.waiting import wait_until

ROW_TRIGGER = postgres_only.ROW_UPDATE_TRIGGER
pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def row_updates() -> Iterator[Any]:
    """``updates(task_id)``: every UPDATE of that task's row so far, in order,
    as ``(status, status_message)``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE test_row_updates (seq bigserial PRIMARY KEY, task_id varchar(64), status varchar(32), "
            "status_message text)"
        )
        cursor.execute(
            "CREATE FUNCTION test_row_updated() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO test_row_updates (task_id, status, status_message) "
            "VALUES (NEW.id, NEW.status, NEW.status_message); RETURN NULL; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_row_updated AFTER UPDATE ON mcptasks_task "
            "FOR EACH ROW EXECUTE FUNCTION test_row_updated()"
        )

    def updates(task_id: str) -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT status, status_message FROM test_row_updates WHERE task_id = %s ORDER BY seq", [task_id]
            )
            return [tuple(row) for row in cursor.fetchall()]

    try:
        yield updates
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_row_updated ON mcptasks_task")
            cursor.execute("DROP FUNCTION IF EXISTS test_row_updated()")
            cursor.execute("DROP TABLE IF EXISTS test_row_updates")


def interval(settings: Any, seconds: float) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "STATUS_INTERVAL_SECONDS": seconds}


def after(updates: list[tuple[str, str]], status: str) -> list[tuple[str, str]]:
    """The updates that came after the first one that left the row ``status``."""
    statuses = [row[0] for row in updates]
    assert status in statuses, updates
    return updates[statuses.index(status) + 1 :]


@ROW_TRIGGER
@pytest.mark.usefixtures("transition_paths")
def test_a_thousand_reports_in_a_second_make_at_most_ten_updates_of_the_row(temp_tool, row_updates):
    returned_in: list[float] = []

    @temp_tool(task="required", description="Reports a thousand times in one second.")
    def chatty(ctx: ToolContext) -> str:
        start = time.monotonic()
        for step in range(1, 1001):
            before = time.monotonic()
            ctx.report_progress(step, 1000)
            returned_in.append(time.monotonic() - before)
            late = start + step / 1000 - time.monotonic()
            if late > 0:
                time.sleep(late)
        return "done"

    task = make_task(tool="chatty", client_capabilities=FULL_CAPS)
    started = time.monotonic()
    assert run_task(task.id) == "completed"
    took = time.monotonic() - started
    time.sleep(0.6)  # a write still pending would land by now
    updates = row_updates(task.id)
    messages = [message for status, message in updates if status == TaskStatus.WORKING and message.startswith("step")]
    print(f"\n{len(updates)} UPDATEs of the row in all ({len(messages)} status messages) for a run of {took:.2f}s")
    assert len(updates) <= 10, updates  # the claim, the status messages and the finish, all together
    assert len(messages) >= 2, updates  # the messages were written during the run, not only dropped
    assert messages == sorted(messages, key=lambda m: int(m.split()[1]))  # in the order reported
    assert after(updates, TaskStatus.COMPLETED) == []
    assert sorted(returned_in)[len(returned_in) // 2] < 0.001  # a report returns at once (the median)


@ROW_TRIGGER
@pytest.mark.usefixtures("transition_paths")
@pytest.mark.parametrize("ending", ["finish", "input", "cancel"])
def test_a_pending_message_is_never_written_after_the_runs_next_durable_write(ending, temp_tool, row_updates, settings):
    interval(settings, 1.5)
    settings.MCPTASKS = {**settings.MCPTASKS, "CANCEL_POLL_SECONDS": 0.05}
    written = threading.Event()

    @temp_tool(task="required", description="Reports twice, then ends one way or another.")
    def reporter(ctx: ToolContext, ending: str) -> str:
        ctx.report_status("first")  # written at once
        assert written.wait(10)
        ctx.report_status("second")  # pending: due an interval after the first
        if ending == "input":
            ctx.elicit("Go on?", key="go")
        elif ending == "cancel":
            ctx.sleep(30)
        return "done"

    task = make_task(tool="reporter", arguments={"ending": ending}, client_capabilities=FULL_CAPS)
    outcome: list[str] = []
    runner = threading.Thread(target=lambda: (outcome.append(run_task(task.id)), connection.close()))
    runner.start()
    wait_until(lambda: Task.objects.get(pk=task.id).status_message == "first", 10, what="the first message")
    written.set()
    if ending == "cancel":
        time.sleep(0.2)
        assert lifecycle.cancel(task.id, actor="client:alice")
    runner.join(20)
    assert not runner.is_alive()
    expected = {"finish": TaskStatus.COMPLETED, "input": TaskStatus.INPUT_REQUIRED, "cancel": TaskStatus.CANCELLED}
    assert outcome == [{"finish": "completed", "input": "input_required", "cancel": "cancelled"}[ending]]
    time.sleep(2.5)  # past the interval: "second" would have been due
    updates = row_updates(task.id)
    assert after(updates, expected[ending]) == [], updates
    assert "second" not in [message for _, message in updates], updates
    final = Task.objects.get(pk=task.id)
    assert final.status == expected[ending]
    assert final.status_message != "second"


@ROW_TRIGGER
def test_ending_a_run_drops_its_pending_message_while_the_task_still_runs(row_updates, settings):
    """The drop itself, where the lease guard would not stop the write: the
    task is still ``working`` under the same run."""
    interval(settings, 0.5)
    task = running_task()
    status = RunStatus(task.id, WORKER, threading.Event())
    status.report("one")
    wait_until(lambda: Task.objects.get(pk=task.id).status_message == "one", 10, what="the first message")
    status.report("two")
    status.end()
    status.report("three")
    time.sleep(1.2)
    assert Task.objects.get(pk=task.id).status_message == "one"
    assert [message for _, message in row_updates(task.id)] == ["", "one"]  # the claim, then "one" alone


@ROW_TRIGGER
def test_a_cancel_seen_drops_the_pending_message(row_updates, settings):
    interval(settings, 0.5)
    task = running_task()
    cancelled = threading.Event()
    status = RunStatus(task.id, WORKER, cancelled)
    status.report("one")
    wait_until(lambda: Task.objects.get(pk=task.id).status_message == "one", 10, what="the first message")
    status.report("two")
    cancelled.set()
    time.sleep(1.2)
    assert [message for _, message in row_updates(task.id)] == ["", "one"]  # the claim, then "one" alone


@pytest.mark.usefixtures("transition_paths")
def test_listeners_get_the_coalesced_changes_in_order(temp_tool, settings):
    interval(settings, 0.1)
    seen: list[tuple[str, Any]] = []

    def listener(*, kind: str, task: Task | None = None, progress: Any = None, **_: Any) -> None:
        seen.append((kind, progress, task.status_message if task is not None else None))

    @temp_tool(task="required", description="Counts to 200 in about a second.")
    def counter(ctx: ToolContext) -> str:
        for step in range(1, 201):
            ctx.report_progress(step, 200)
            time.sleep(0.005)
        return "done"

    signals.task_changed.connect(listener, sender=Task)
    try:
        task = make_task(tool="counter", client_capabilities=FULL_CAPS)
        assert run_task(task.id) == "completed"
        time.sleep(0.3)
    finally:
        signals.task_changed.disconnect(listener, sender=Task)
    kinds = [kind for kind, _, _ in seen]
    reports = [(progress, message) for kind, progress, message in seen if kind == "status_message"]
    assert 2 <= len(reports) <= 20, seen
    numbers = [progress["progress"] for progress, _ in reports]
    assert numbers == sorted(set(numbers)), numbers  # in order, none twice
    assert all(progress["total"] == 200 for progress, _ in reports)
    assert [message for _, message in reports] == [progress_text(n, 200) for n in numbers]
    last_report = max(i for i, kind in enumerate(kinds) if kind == "status_message")
    assert kinds[-1] == "transition" and last_report < len(kinds) - 1, kinds  # none after the finish


def test_progress_numbers_become_the_message_when_the_tool_gave_none():
    assert progress_text(3, 10) == "step 3 of 10"
    assert progress_text(3.0, 10.0) == "step 3 of 10"
    assert progress_text(2.5) == "step 2.5"
    reports: list[tuple[str, dict[str, Any]]] = []
    ctx = ToolContext(owner="alice", task_id="t", in_task=True, on_progress=lambda m, p: reports.append((m, p)))
    ctx.report_progress(3, 10)
    ctx.report_progress(4, 10, "halfway")
    assert reports == [
        ("step 3 of 10", {"progress": 3, "total": 10}),
        ("halfway", {"progress": 4, "total": 10, "message": "halfway"}),
    ]
    for bad in (float("nan"), float("inf"), True, "3"):
        with pytest.raises(ValueError):
            ctx.report_progress(bad, 10)  # type: ignore[arg-type]


@pytest.fixture
def legacy(client: Any) -> Any:
    from tests.support.legacy import DjangoLegacy

    session = DjangoLegacy(client)
    session.initialize()
    return session


def test_a_2025_tasks_progress_token_is_kept_with_it_and_bounded(legacy):
    from mcptasks.models import LegacyTask

    for token in ("steps-1", 7, "x" * 256):
        reply = legacy.call_tool("count_to", {"n": 1}, task={}, _meta={"progressToken": token})
        assert LegacyTask.objects.get(task_id=reply.result["task"]["taskId"]).progress_token == token
    reply = legacy.call_tool("count_to", {"n": 1}, task={})
    assert LegacyTask.objects.get(task_id=reply.result["task"]["taskId"]).progress_token is None
    before = Task.objects.count()
    for bad in ("x" * 257, 1.5, True, {"a": 1}, [1], 2**63):
        reply = legacy.call_tool("count_to", {"n": 1}, task={}, _meta={"progressToken": bad})
        assert reply.error["code"] == -32602, (bad, reply)
    assert Task.objects.count() == before  # refused before any task was made
