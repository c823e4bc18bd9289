"""Answers to a task's input requests (lifecycle.submit_input)."""

from __future__ import annotations

import pytest

from mcptasks.models import InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from tests.support.factories import WORKER, accept, cancelled_task, transitions, waiting_task

pytestmark = pytest.mark.django_db

ACTOR = "client:alice"


def states(task: Task) -> dict[str, str]:
    return dict(InputRequest.objects.filter(task=task).values_list("key", "state"))


def run_messages(published: list[dict]) -> list[list[str]]:
    return [m["args"] for m in published if m["task"] == "mcptasks.run_task"]


def test_partial_answer_keeps_input_required(django_capture_on_commit_callbacks, published):
    task = waiting_task(keys=["first", "second"])
    with django_capture_on_commit_callbacks(execute=True):
        accepted = lifecycle.submit_input(task.id, {"first": accept(name="Ada")}, actor=ACTOR)
    assert accepted == ["first"]
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED
    assert states(task) == {"first": InputRequestState.ANSWERED, "second": InputRequestState.PENDING}
    assert InputRequest.objects.get(task=task, key="first").response == accept(name="Ada")
    assert run_messages(published) == [], "a partial answer must not start a run"
    event = TaskEvent.objects.get(task=task, kind="input")
    assert (event.actor, event.detail) == (ACTOR, {"keys": ["first"]})


def test_last_answer_resumes_and_enqueues_once(django_capture_on_commit_callbacks, published):
    task = waiting_task(keys=["first", "second"])
    lifecycle.submit_input(task.id, {"first": accept()}, actor=ACTOR)
    with django_capture_on_commit_callbacks(execute=True):
        accepted = lifecycle.submit_input(task.id, {"second": accept()}, actor=ACTOR)
        assert run_messages(published) == [], "the run is enqueued only after commit"
    assert accepted == ["second"]
    task = Task.objects.get(pk=task.id)
    assert task.status == TaskStatus.WORKING
    assert task.dispatched_at is not None
    assert task.status_message == ""
    assert transitions(task.id)[-1] == ("input_required", "working")
    assert run_messages(published) == [[task.id]]


def test_all_answers_at_once_resume(django_capture_on_commit_callbacks, published):
    task = waiting_task(keys=["first", "second"])
    with django_capture_on_commit_callbacks(execute=True):
        accepted = lifecycle.submit_input(task.id, {"second": accept(), "first": accept()}, actor=ACTOR)
    assert sorted(accepted) == ["first", "second"]
    assert Task.objects.get(pk=task.id).status == TaskStatus.WORKING
    assert run_messages(published) == [[task.id]]


def test_unknown_keys_are_ignored(django_capture_on_commit_callbacks, published):
    task = waiting_task(keys=["first"])
    with django_capture_on_commit_callbacks(execute=True):
        accepted = lifecycle.submit_input(task.id, {"nope": accept(), "also-not": 1}, actor=ACTOR)
    assert accepted == []
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED
    assert states(task) == {"first": InputRequestState.PENDING}
    assert not TaskEvent.objects.filter(task=task, kind="input").exists()
    assert run_messages(published) == []


def test_unknown_keys_next_to_a_real_one_do_not_block_it():
    task = waiting_task(keys=["first"])
    accepted = lifecycle.submit_input(task.id, {"first": accept(), "ghost": accept()}, actor=ACTOR)
    assert accepted == ["first"]
    assert Task.objects.get(pk=task.id).status == TaskStatus.WORKING
    assert not InputRequest.objects.filter(task=task, key="ghost").exists()


def test_a_stale_answer_does_not_overwrite_the_first():
    task = waiting_task(keys=["first", "second"])
    assert lifecycle.submit_input(task.id, {"first": accept(v=1)}, actor=ACTOR) == ["first"]
    assert lifecycle.submit_input(task.id, {"first": accept(v=2)}, actor=ACTOR) == []
    assert InputRequest.objects.get(task=task, key="first").response == accept(v=1)
    assert TaskEvent.objects.filter(task=task, kind="input").count() == 1


def test_answers_after_the_task_resumed_are_ignored(django_capture_on_commit_callbacks, published):
    task = waiting_task(keys=["only"])
    lifecycle.submit_input(task.id, {"only": accept(v=1)}, actor=ACTOR)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.submit_input(task.id, {"only": accept(v=2)}, actor=ACTOR) == []
    assert run_messages(published) == [], "a repeated answer must not enqueue a second run"
    assert InputRequest.objects.get(task=task, key="only").response == accept(v=1)


def test_withdrawn_requests_cannot_be_answered():
    task = waiting_task(keys=["only"])
    assert lifecycle.cancel(task.id, actor=ACTOR)
    assert lifecycle.submit_input(task.id, {"only": accept()}, actor=ACTOR) == []
    assert states(task) == {"only": InputRequestState.WITHDRAWN}
    assert Task.objects.get(pk=task.id).status == TaskStatus.CANCELLED


def test_terminal_task_accepts_nothing():
    task = cancelled_task()
    assert lifecycle.submit_input(task.id, {"anything": accept()}, actor=ACTOR) == []


def test_the_next_run_sees_the_answers():
    task = waiting_task(keys=["first", "second"])
    lifecycle.submit_input(task.id, {"first": accept(n=1), "second": accept(n=2)}, actor=ACTOR)
    claimed = lifecycle.claim(task.id, worker=WORKER)
    assert claimed is not None
    answers = dict(claimed.input_requests.filter(state=InputRequestState.ANSWERED).values_list("key", "response"))
    assert answers == {"first": accept(n=1), "second": accept(n=2)}


@pytest.mark.parametrize("bad", [12345, "yes", {"content": {"confirm": True}}, {"action": "maybe"}])
def test_a_malformed_answer_refuses_the_whole_update(bad):
    """An answer that is not an ElicitResult for a pending elicitation is
    invalid params; nothing of that update is recorded (all or nothing)."""
    from mcptasks.errors import InvalidParams

    task = waiting_task(keys=["first", "second"])
    with pytest.raises(InvalidParams):
        lifecycle.submit_input(task.id, {"first": accept(ok=True), "second": bad}, actor=ACTOR)
    assert states(task) == {"first": InputRequestState.PENDING, "second": InputRequestState.PENDING}
    assert not TaskEvent.objects.filter(task=task, kind="input").exists()
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED
    assert sorted(lifecycle.submit_input(task.id, {"first": accept(), "second": accept()}, actor=ACTOR)) == [
        "first",
        "second",
    ]


def test_unknown_keys_are_not_validated():
    task = waiting_task(keys=["first"])
    assert lifecycle.submit_input(task.id, {"unknown-key": {"ignored": True}, "x": 5}, actor=ACTOR) == []
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED
