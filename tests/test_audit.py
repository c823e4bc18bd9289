"""The audit trail: an event per transition with its actor and time,
structured log lines, signals after commit, and the retrieval audit."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from mcptasks import signals
from mcptasks.audit import JsonFormatter
from mcptasks.models import Task, TaskEvent
from mcptasks.tasks import lifecycle, reads
from tests.support.factories import WORKER, accept, completed_task, make_task, running_task, waiting_task

pytestmark = pytest.mark.django_db


def timeline(task_id: str) -> list[tuple[str, str, str, str]]:
    return [
        (e.kind, e.from_status, e.to_status, e.actor)
        for e in TaskEvent.objects.filter(task_id=task_id).order_by("at", "id")
    ]


@pytest.fixture
def changes() -> Any:
    seen: list[dict[str, Any]] = []

    def record(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.task_changed.connect(record, weak=False)
    try:
        yield seen
    finally:
        signals.task_changed.disconnect(record)


# Events ------------------------------------------------------------------------------------------


def test_every_transition_is_an_event_with_its_actor_and_time(settings):
    before = timezone.now()
    task = waiting_task(keys=["q"], owner="alice")
    lifecycle.submit_input(task.id, {"q": accept(confirm=True)}, actor="client:alice")
    assert lifecycle.claim(task.id, worker="w2") is not None
    lifecycle.complete(task.id, {"content": [], "isError": False}, worker="w2")
    assert timeline(task.id) == [
        ("created", "", "working", "client:alice"),
        ("run_started", "", "", f"worker:{WORKER}"),
        ("transition", "working", "input_required", f"worker:{WORKER}"),
        ("input", "", "", "client:alice"),
        ("transition", "input_required", "working", "client:alice"),
        ("run_started", "", "", "worker:w2"),
        ("transition", "working", "completed", "worker:w2"),
    ]
    times = list(TaskEvent.objects.filter(task_id=task.id).order_by("at", "id").values_list("at", flat=True))
    assert before <= times[0] and times == sorted(times) and times[-1] <= timezone.now()


def test_operator_and_system_actors():
    cancelled = running_task()
    lifecycle.cancel(cancelled.id, actor=lifecycle.operator_actor("maria"))
    abandoned = running_task(worker="w9")
    Task.objects.filter(pk=abandoned.id).update(attempts=99, lease_expires_at=timezone.now() - timedelta(seconds=5))
    lifecycle.sweep()
    assert timeline(cancelled.id)[-1] == ("transition", "working", "cancelled", "operator:maria")
    assert timeline(abandoned.id)[-1] == ("transition", "working", "failed", "system")


# Structured log lines and signals ----------------------------------------------------------------


def test_each_committed_change_logs_a_structured_line(caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.INFO, logger="mcptasks.lifecycle")
    with django_capture_on_commit_callbacks(execute=True):
        task = make_task(owner="alice")
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.cancel(task.id, actor="operator:maria")
    records = [r for r in caplog.records if r.name == "mcptasks.lifecycle"]
    assert [(r.task_id, r.kind, r.from_status, r.to_status, r.actor) for r in records] == [
        (task.id, "created", "", "working", "client:alice"),
        (task.id, "transition", "working", "cancelled", "operator:maria"),
    ]
    assert records[1].getMessage() == f"task {task.id} transition working -> cancelled by operator:maria"


def test_json_formatter_writes_the_fields(caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.INFO, logger="mcptasks.lifecycle")
    with django_capture_on_commit_callbacks(execute=True):
        task = make_task(owner="alice")
    record = next(r for r in caplog.records if r.name == "mcptasks.lifecycle")
    data = json.loads(JsonFormatter().format(record))
    assert data["logger"] == "mcptasks.lifecycle" and data["level"] == "INFO"
    assert {k: data[k] for k in ("task_id", "kind", "from_status", "to_status", "actor")} == {
        "task_id": task.id,
        "kind": "created",
        "from_status": "",
        "to_status": "working",
        "actor": "client:alice",
    }
    assert data["time"].endswith("+00:00")


def test_signals_fire_after_commit_and_never_for_a_rollback(changes, django_capture_on_commit_callbacks):
    task = running_task()
    with django_capture_on_commit_callbacks(execute=False) as pending:
        lifecycle.cancel(task.id, actor="operator:maria")
    assert changes == []  # not yet committed
    for callback in pending:
        callback()
    assert [(c["task_id"], c["from_status"], c["to_status"], c["actor"], c["kind"]) for c in changes] == [
        (task.id, "working", "cancelled", "operator:maria", "transition")
    ]

    other = running_task(worker="w2")
    changes.clear()
    with django_capture_on_commit_callbacks(execute=True):
        try:
            with transaction.atomic():
                lifecycle.cancel(other.id, actor="operator:maria")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
    assert changes == []
    assert Task.objects.get(pk=other.id).status == "working"


# Retrieval ---------------------------------------------------------------------------------------


def test_retrieval_of_a_running_task_costs_nothing(caplog, django_assert_num_queries):
    caplog.set_level(logging.INFO, logger="mcptasks.audit")
    task = running_task()
    with django_assert_num_queries(0):
        assert lifecycle.note_result_retrieved(task, actor="client:alice") is False
    assert not [r for r in caplog.records if r.name == "mcptasks.audit"]


def test_retrieval_of_a_finished_task_is_logged_each_time_and_recorded_once(caplog, django_assert_num_queries):
    caplog.set_level(logging.INFO, logger="mcptasks.audit")
    task = completed_task(owner="alice")
    assert lifecycle.note_result_retrieved(task, actor="client:alice") is True
    with django_assert_num_queries(0):  # later reads: the row carries the mark
        assert lifecycle.note_result_retrieved(task, actor="client:alice") is False
    polled = reads.lookup(task.id, "alice")  # as a later tasks/get reads it
    assert polled.outcome_read_at is not None
    with django_assert_num_queries(0):
        assert lifecycle.note_result_retrieved(polled, actor="client:alice") is False
    stale = Task.objects.get(pk=task.id)
    stale.outcome_read_at = None  # read before the first read committed
    assert lifecycle.note_result_retrieved(stale, actor="client:alice") is False
    events = TaskEvent.objects.filter(task=task, kind="result_retrieved")
    assert [(e.actor, e.detail) for e in events] == [("client:alice", {"status": "completed"})]
    records = [r for r in caplog.records if r.name == "mcptasks.audit"]
    assert len(records) == 4  # every read is logged
    assert {(r.task_id, r.kind, r.status, r.tool, r.owner, r.actor) for r in records} == {
        (task.id, "result_retrieved", "completed", "slow_compute", "alice", "client:alice")
    }


@pytest.mark.django_db(transaction=True)  # /mcp does its database work on its own threads
def test_tasks_get_audits_the_first_read_of_the_outcome(rpc):
    reply = rpc.call_tool("slow_compute", {"seconds": 30}, extra={"task": {}})
    task_id = reply.result["taskId"]
    for _ in range(3):
        assert rpc.tasks_get(task_id).result["status"] == "working"
    assert not TaskEvent.objects.filter(task_id=task_id, kind="result_retrieved").exists()
    lifecycle.cancel(task_id, actor="operator:maria")
    for _ in range(3):
        assert rpc.tasks_get(task_id).result["status"] == "cancelled"
    (event,) = TaskEvent.objects.filter(task_id=task_id, kind="result_retrieved")
    assert event.actor == "client:anonymous"
