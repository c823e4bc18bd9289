"""Status transitions and their guards (mcptasks.lifecycle), on Postgres."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from mcptasks.conf import settings as mcp_settings
from mcptasks.models import InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from mcptasks.tasks import transitions as transitions_rule
from tests.support.factories import (
    WORKER,
    cancelled_task,
    completed_task,
    elicit,
    failed_task,
    make_task,
    running_task,
    terminal_transitions,
    transitions,
    waiting_task,
)

pytestmark = pytest.mark.django_db


def reload(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


# Creation --------------------------------------------------------------------------


def test_create_task_is_working_with_a_created_event():
    task = make_task(owner="alice", tool="slow_compute", arguments={"seconds": 1})
    task = reload(task)
    assert task.status == TaskStatus.WORKING
    assert task.owner == "alice"
    assert task.arguments == {"seconds": 1}
    assert task.ttl_ms == mcp_settings.DEFAULT_TTL_MS
    assert task.expires_at == task.created_at + timedelta(milliseconds=task.ttl_ms)
    assert task.poll_interval_ms == mcp_settings.POLL_INTERVAL_MS
    assert task.attempts == 0
    assert task.lease_owner == ""
    events = list(TaskEvent.objects.filter(task=task))
    assert [(e.kind, e.from_status, e.to_status, e.actor) for e in events] == [
        ("created", "", "working", "client:alice")
    ]


def test_create_task_enqueues_only_after_commit(django_capture_on_commit_callbacks, published):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        task = lifecycle.create_task(owner="alice", tool_name="slow_compute", arguments={})
        assert published == [], "a run must not be published before the task row is committed"
    assert callbacks, "create_task registered no on_commit callback"
    runs = [m for m in published if m["task"] == "mcptasks.run_task"]
    assert [m["args"] for m in runs] == [[task.id]]
    assert reload(task).dispatched_at is not None


def test_create_task_without_enqueue_publishes_nothing(django_capture_on_commit_callbacks, published):
    with django_capture_on_commit_callbacks(execute=True):
        task = make_task()
    assert published == []
    assert reload(task).dispatched_at is None


def test_create_task_records_answers_given_before_the_task_existed():
    answered = {"name": lifecycle.Answer(method="elicitation/create", params={"message": "?"}, response={"a": 1})}
    task = lifecycle.create_task(owner="o", tool_name="t", arguments={}, answered=answered, enqueue=False)
    row = InputRequest.objects.get(task=task)
    assert (row.key, row.state, row.response) == ("name", InputRequestState.ANSWERED, {"a": 1})


# TTL -------------------------------------------------------------------------------------


def test_ttl_defaults_and_clamps_to_max(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "DEFAULT_TTL_MS": 5_000, "MAX_TTL_MS": 60_000}
    assert lifecycle.clamp_ttl(None) == 5_000
    assert lifecycle.clamp_ttl(None, 7_000) == 7_000
    assert lifecycle.clamp_ttl(10_000) == 10_000
    assert lifecycle.clamp_ttl(60_001) == 60_000
    assert lifecycle.clamp_ttl(10**15) == 60_000
    assert lifecycle.clamp_ttl(-5) == 0
    task = reload(make_task(ttl_ms=10**12))
    assert task.ttl_ms == 60_000
    assert task.expires_at == task.created_at + timedelta(milliseconds=60_000)


@given(requested=st.one_of(st.none(), st.integers(min_value=-(2**62), max_value=2**62)))
def test_clamp_ttl_is_always_within_bounds(requested):
    ttl = lifecycle.clamp_ttl(requested)
    assert 0 <= ttl <= mcp_settings.MAX_TTL_MS
    if requested is not None and 0 <= requested <= mcp_settings.MAX_TTL_MS:
        assert ttl == requested


# The happy path -----------------------------------------------------------------------


@pytest.mark.usefixtures("transition_paths")
def test_claim_then_complete():
    task = running_task()
    assert task.lease_owner == WORKER
    assert task.attempts == 1
    assert task.lease_expires_at > timezone.now()
    assert lifecycle.complete(task.id, {"content": [{"type": "text", "text": "ok"}], "isError": False}, worker=WORKER)
    task = reload(task)
    assert task.status == TaskStatus.COMPLETED
    assert task.result["content"][0]["text"] == "ok"
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    assert transitions(task.id) == [("", "working"), ("working", "completed")]
    event = TaskEvent.objects.get(task=task, to_status="completed")
    assert event.actor == f"worker:{WORKER}"


def test_input_round_trip_transitions():
    task = waiting_task(keys=["only"])
    assert task.status == TaskStatus.INPUT_REQUIRED
    assert task.lease_owner == ""
    assert task.attempts == 0, "asking for input is a clean stop: the attempt counter restarts"
    assert lifecycle.submit_input(task.id, {"only": {"action": "accept"}}, actor="client:alice") == ["only"]
    assert reload(task).status == TaskStatus.WORKING
    assert transitions(task.id) == [("", "working"), ("working", "input_required"), ("input_required", "working")]


# Guards ----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("transition_paths")
def test_complete_needs_the_lease():
    task = running_task()
    assert not lifecycle.complete(task.id, {"content": []}, worker="someone-else")
    assert reload(task).status == TaskStatus.WORKING
    assert terminal_transitions(task.id) == []


@pytest.mark.usefixtures("transition_paths")
def test_complete_is_refused_while_waiting_for_input():
    task = waiting_task()
    assert not lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    assert not lifecycle.complete(task.id, {"content": []}, worker="")
    assert reload(task).status == TaskStatus.INPUT_REQUIRED


def test_request_input_needs_working_and_the_lease():
    task = running_task()
    assert not lifecycle.request_input(task.id, {"k": elicit()}, worker="intruder")
    assert reload(task).status == TaskStatus.WORKING
    assert not InputRequest.objects.filter(task=task).exists()
    waiting = waiting_task()
    assert not lifecycle.request_input(waiting.id, {"k": elicit()}, worker=WORKER)
    assert set(InputRequest.objects.filter(task=waiting).values_list("key", flat=True)) == {"first", "second"}


def test_fail_with_a_worker_needs_its_lease():
    task = running_task()
    assert not lifecycle.fail(task.id, {"code": -32603, "message": "x"}, actor="worker:x", worker="intruder")
    assert reload(task).status == TaskStatus.WORKING
    assert lifecycle.fail(task.id, {"code": -32603, "message": "x"}, actor="worker:x", worker=WORKER)
    task = reload(task)
    assert task.status == TaskStatus.FAILED
    assert task.error == {"code": -32603, "message": "x"}
    assert task.status_message == "x"


def test_cancel_and_fail_are_allowed_from_input_required():
    waiting = waiting_task()
    assert lifecycle.cancel(waiting.id, actor="client:alice")
    assert reload(waiting).status == TaskStatus.CANCELLED
    waiting = waiting_task()
    assert lifecycle.fail(waiting.id, {"code": -32603, "message": "gone"}, actor="system")
    assert reload(waiting).status == TaskStatus.FAILED


@pytest.mark.usefixtures("transition_paths")
def test_unknown_task_is_never_transitioned():
    assert not lifecycle.cancel("no-such-task", actor="x")
    assert not lifecycle.fail("no-such-task", {"code": 1, "message": "x"}, actor="x")
    assert not lifecycle.complete("no-such-task", {}, worker=WORKER)
    assert lifecycle.claim("no-such-task", worker=WORKER) is None
    assert lifecycle.submit_input("no-such-task", {"a": {}}, actor="x") == []
    assert not lifecycle.expire_now("no-such-task", actor="x")
    assert not TaskEvent.objects.exists()


TERMINAL_FACTORIES = {"completed": completed_task, "failed": failed_task, "cancelled": cancelled_task}


@pytest.mark.parametrize("status", sorted(TERMINAL_FACTORIES))
@pytest.mark.usefixtures("transition_paths")
def test_terminal_is_final(status):
    task = TERMINAL_FACTORIES[status]()
    assert task.status == status
    before = reload(task)
    events_before = TaskEvent.objects.filter(task=task).count()

    assert not lifecycle.complete(task.id, {"content": [{"type": "text", "text": "late"}]}, worker=WORKER)
    assert not lifecycle.complete(task.id, {"content": []}, worker="")
    assert not lifecycle.fail(task.id, {"code": -32603, "message": "late"}, actor="system")
    assert not lifecycle.cancel(task.id, actor="client:alice")
    assert not lifecycle.request_input(task.id, {"late": elicit()}, worker=WORKER)
    assert lifecycle.submit_input(task.id, {"late": {"action": "accept"}}, actor="client:alice") == []
    assert lifecycle.claim(task.id, worker="another") is None
    assert not lifecycle.heartbeat(task.id, worker=WORKER)
    assert not lifecycle.set_status_message(task.id, "late", worker=WORKER)
    lifecycle.sweep()

    after = reload(task)
    assert after.status == status
    assert (after.result, after.error, after.status_message) == (before.result, before.error, before.status_message)
    assert TaskEvent.objects.filter(task=task).count() == events_before
    assert len(terminal_transitions(task.id)) == 1
    assert not InputRequest.objects.filter(task=task, key="late").exists()


def test_terminal_transition_withdraws_pending_requests():
    task = waiting_task(keys=["a", "b"])
    assert lifecycle.submit_input(task.id, {"a": {"action": "accept"}}, actor="client:alice") == ["a"]
    assert lifecycle.cancel(task.id, actor="client:alice")
    states = dict(InputRequest.objects.filter(task=task).values_list("key", "state"))
    assert states == {"a": InputRequestState.ANSWERED, "b": InputRequestState.WITHDRAWN}


def test_cancel_records_who_and_clears_the_lease():
    task = running_task()
    assert lifecycle.cancel(task.id, actor="client:alice", reason="changed my mind")
    task = reload(task)
    assert task.status == TaskStatus.CANCELLED
    assert task.cancelled_by == "client:alice"
    assert task.cancel_requested_at is not None
    assert task.status_message == "changed my mind"
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    event = TaskEvent.objects.get(task=task, to_status="cancelled")
    assert (event.from_status, event.actor) == ("working", "client:alice")


@pytest.mark.usefixtures("transition_paths")
def test_a_key_keeps_its_first_meaning():
    task = waiting_task(keys=["a"])
    original = InputRequest.objects.get(task=task, key="a").params
    lifecycle.submit_input(task.id, {"a": {"action": "accept"}}, actor="client:alice")
    assert lifecycle.claim(task.id, worker=WORKER) is not None
    changed = elicit("a different question")
    assert lifecycle.request_input(task.id, {"a": changed, "b": elicit("b")}, worker=WORKER)
    rows = {r.key: r for r in InputRequest.objects.filter(task=task)}
    assert rows["a"].params == original
    assert rows["a"].state == InputRequestState.ANSWERED
    assert rows["b"].state == InputRequestState.PENDING


# Leases -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("transition_paths")
def test_claim_refuses_a_live_lease_and_takes_a_lapsed_one():
    task = running_task()
    assert lifecycle.claim(task.id, worker="second") is None
    Task.objects.filter(pk=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    again = lifecycle.claim(task.id, worker="second")
    assert again is not None
    assert (again.lease_owner, again.attempts) == ("second", 2)
    assert not lifecycle.heartbeat(task.id, worker=WORKER), "the old run lost its lease"
    assert not lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    assert lifecycle.complete(task.id, {"content": []}, worker="second")


@pytest.mark.usefixtures("transition_paths")
def test_claim_refuses_input_required():
    task = waiting_task()
    assert lifecycle.claim(task.id, worker="w") is None
    assert reload(task).attempts == 0


@pytest.mark.usefixtures("transition_paths")
def test_claim_past_max_attempts_fails_the_task(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ATTEMPTS": 2}
    task = make_task()
    Task.objects.filter(pk=task.id).update(attempts=2)
    assert lifecycle.claim(task.id, worker=WORKER) is None
    task = reload(task)
    assert task.status == TaskStatus.FAILED
    assert task.error["code"] == -32603
    assert "abandoned" in task.error["message"].lower()


def test_heartbeat_extends_only_the_holders_lease():
    task = running_task()
    Task.objects.filter(pk=task.id).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    assert lifecycle.heartbeat(task.id, worker=WORKER)
    assert reload(task).lease_expires_at > timezone.now() + timedelta(seconds=mcp_settings.LEASE_SECONDS - 5)
    assert not lifecycle.heartbeat(task.id, worker="other")


@pytest.mark.usefixtures("transition_paths")
def test_release_gives_the_attempt_back():
    task = running_task()
    lifecycle.release(task.id, worker=WORKER)
    task = reload(task)
    assert (task.lease_owner, task.lease_expires_at, task.attempts) == ("", None, 0)
    assert task.status == TaskStatus.WORKING
    assert lifecycle.claim(task.id, worker="next") is not None


def test_set_status_message_while_running():
    task = running_task()
    assert lifecycle.set_status_message(task.id, "halfway", worker=WORKER)
    assert reload(task).status_message == "halfway"
    assert not lifecycle.set_status_message(task.id, "nope", worker="other")
    assert reload(task).status_message == "halfway"


# expire_now ---------------------------------------------------------------------------------------


def test_expire_now_cancels_an_active_task_and_makes_it_prunable():
    task = running_task()
    assert lifecycle.expire_now(task.id, actor="operator:cli")
    task = reload(task)
    assert task.status == TaskStatus.CANCELLED
    assert task.expires_at <= timezone.now()
    assert lifecycle.prune_expired() == 1
    assert not Task.objects.filter(pk=task.id).exists()


@pytest.mark.usefixtures("transition_paths")
def test_expire_now_on_a_terminal_task_keeps_its_status():
    task = completed_task()
    assert lifecycle.expire_now(task.id, actor="operator:cli")
    task = reload(task)
    assert task.status == TaskStatus.COMPLETED
    assert task.expires_at <= timezone.now()
    assert len(terminal_transitions(task.id)) == 1


# The status rule ---------------------------------------------------------------------

#: The protocol's status graph: each status and the statuses it may move to.
PROTOCOL_MOVES = {
    "working": {"input_required", "completed", "failed", "cancelled"},
    "input_required": {"working", "failed", "cancelled"},
    "completed": set(),
    "failed": set(),
    "cancelled": set(),
}

#: A task in each status, its run's lease held by ``WORKER`` where it runs.
IN_STATUS = {
    "working": running_task,
    "input_required": lambda: waiting_task(keys=["only"]),
    **TERMINAL_FACTORIES,
}


def _move_to(task: Task, to: str) -> None:
    """Ask for the move to ``to`` through the transition that makes it."""
    if to == "working":
        lifecycle.submit_input(task.id, {"only": {"action": "accept", "content": {"confirm": True}}}, actor="c")
    elif to == "input_required":
        lifecycle.request_input(task.id, {"late": elicit()}, worker=WORKER)
    elif to == "completed":
        lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    elif to == "failed":
        lifecycle.fail(task.id, {"code": -32603, "message": "boom"}, actor="system")
    else:
        lifecycle.cancel(task.id, actor="client:alice")


def test_the_status_rule_is_the_protocols_graph():
    assert {str(s): {str(t) for t in transitions_rule.MOVES.get(s, ())} for s in TaskStatus} == PROTOCOL_MOVES


@pytest.mark.parametrize(
    ("start", "to"), [(start, to) for start in sorted(PROTOCOL_MOVES) for to in sorted(PROTOCOL_MOVES) if start != to]
)
@pytest.mark.usefixtures("transition_paths")
def test_every_move_is_applied_or_refused_by_the_one_rule(start, to):
    task = IN_STATUS[start]()
    _move_to(task, to)
    if to in PROTOCOL_MOVES[start]:
        assert reload(task).status == to
        assert transitions(task.id)[-1] == (start, to)
    else:
        assert reload(task).status == start
        assert all(step[1] != to for step in transitions(task.id)[1:]), transitions(task.id)


@pytest.mark.parametrize("to", ["working", "input_required", "completed", "failed", "cancelled"])
@pytest.mark.usefixtures("transition_paths")
def test_narrowing_the_rule_narrows_every_writer(monkeypatch, to):
    """The rule has one home: taken out of ``MOVES``, a move is refused by
    the statement on Postgres and by the ORM twin alike."""
    start = "input_required" if to == "working" else "working"
    narrowed = {**transitions_rule.MOVES, start: transitions_rule.MOVES[start] - {to}}
    monkeypatch.setattr(transitions_rule, "MOVES", narrowed)
    task = IN_STATUS[start]()
    _move_to(task, to)
    assert reload(task).status == start
