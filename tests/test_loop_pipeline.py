"""The event loop's pipeline (``protocol/modern/handlers.py``, ``serve_on_loop``): a task tool's
creation and ``tasks/cancel`` on both paths, thread and loop (``poll_rpc``),
with the same rows, events, counts and answers; a creation on the loop
commits, then publishes its run, then answers."""

from __future__ import annotations

import base64
import json
import os

import pytest
import redis

from mcptasks.models import ActiveTaskCount, InputRequest, Task, TaskEvent
from mcptasks.tasks import quota
from tests.support import postgres_only
from tests.support.factories import accept, cancelled_task, running_task, waiting_task
from tests.support.rpc import TASKS_CAPS

pytestmark = pytest.mark.django_db(transaction=True)  # /mcp does its database work on its own threads


def _counted(owner: str) -> int:
    return quota.active_count(owner)


def _served_on_the_loop(client: object, loop_served: list[int], count: int) -> None:
    """On the loop path, every request of the test after the first was served there."""
    from tests.support.asgi import AsgiRpc

    if isinstance(client, AsgiRpc):
        assert len(loop_served) == count, loop_served


def test_a_task_tools_creation_commits_its_row_and_event_on_both_paths(poll_rpc, loop_served):
    created = poll_rpc.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS).result
    assert created["resultType"] == "task" and created["status"] == "working"
    task = Task.objects.get(pk=created["taskId"])
    assert (task.owner, task.tool_name, task.arguments, task.era) == (
        "anonymous",
        "slow_compute",
        {"seconds": 30},
        "2026-07-28",
    )
    (event,) = TaskEvent.objects.filter(task=task)
    assert (event.kind, event.to_status, event.actor) == ("created", "working", "client:anonymous")
    assert _counted("anonymous") == 1
    got = poll_rpc.tasks_get(task.id).result
    assert {k: got[k] for k in ("taskId", "status", "createdAt", "ttlMs", "pollIntervalMs")} == {
        k: created[k] for k in ("taskId", "status", "createdAt", "ttlMs", "pollIntervalMs")
    }
    _served_on_the_loop(poll_rpc, loop_served, 2)


@postgres_only.LOOP_POLLS
def test_a_creation_on_the_loop_publishes_its_run_after_the_commit(redis_poll_throttle, loop_runs, loop_served):
    from tests.support.asgi import AsgiRpc

    client = AsgiRpc()
    client.request("server/discover")  # identifies the caller, on a thread
    created = client.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS).result
    assert loop_served == [200]
    raw = redis.Redis.from_url(os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")).rpop(loop_runs)
    message = json.loads(raw)
    assert json.loads(base64.b64decode(message["body"]))[0] == [created["taskId"]]
    assert message["headers"]["task"] == "mcptasks.run_task"
    assert Task.objects.filter(pk=created["taskId"], status="working").exists()


@postgres_only.LOOP_POLLS
def test_a_creation_near_the_quota_is_checked_alone_and_refused_alike(
    settings, redis_poll_throttle, loop_runs, loop_served
):
    """A quota too small to share the owner's lock: the loop hands the
    creation to a thread, which counts exactly and refuses the one too many."""
    from tests.support.asgi import AsgiRpc

    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_ACTIVE_TASKS_PER_OWNER": 1}
    client = AsgiRpc()
    client.request("server/discover")
    first = client.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS)
    assert first.result["status"] == "working"
    refused = client.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS)
    assert refused.error["message"].startswith("Too many active tasks")
    assert loop_served == [200, refused.status]
    assert Task.objects.filter(owner="anonymous").count() == 1


def test_a_cancel_moves_the_task_with_its_event_and_count_on_both_paths(poll_rpc, loop_served):
    task = running_task(owner="anonymous")
    assert _counted("anonymous") == 1
    assert poll_rpc.tasks_cancel(task.id).result["resultType"] == "complete"
    task.refresh_from_db()
    assert (task.status, task.cancelled_by, task.lease_owner) == ("cancelled", "client:anonymous", "")
    assert task.status_message == "The task was cancelled."
    (event,) = TaskEvent.objects.filter(task=task, kind="transition", to_status="cancelled")
    assert (event.from_status, event.actor) == ("working", "client:anonymous")
    assert _counted("anonymous") == 0
    assert sum(ActiveTaskCount.objects.filter(owner="anonymous").values_list("active", flat=True)) == 0
    again = poll_rpc.tasks_cancel(task.id)
    assert again.result["resultType"] == "complete"  # terminal is final: nothing moves twice
    assert TaskEvent.objects.filter(task=task, to_status="cancelled").count() == 1
    assert poll_rpc.tasks_get(task.id).result["status"] == "cancelled"
    _served_on_the_loop(poll_rpc, loop_served, 3)


def test_a_cancel_withdraws_the_questions_a_waiting_task_asked(poll_rpc, loop_served):
    task = waiting_task(owner="anonymous")
    assert poll_rpc.tasks_cancel(task.id).result["resultType"] == "complete"
    assert set(InputRequest.objects.filter(task=task).values_list("state", flat=True)) == {"withdrawn"}
    (event,) = TaskEvent.objects.filter(task=task, to_status="cancelled")
    assert event.from_status == "input_required"
    _served_on_the_loop(poll_rpc, loop_served, 1)


def _runs_published(client: object, published: list[dict], queue: str | None) -> list[str]:
    """The task ids whose runs were published: from the loop straight to
    Redis (``loop_runs``), from a thread through Celery (``published``)."""
    from tests.support.asgi import AsgiRpc

    if not isinstance(client, AsgiRpc):
        return [m["args"][0] for m in published if m["task"] == "mcptasks.run_task"]
    url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    raw = redis.Redis.from_url(url).lrange(queue, 0, -1)
    return [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in raw]


def _loop_queue(request: pytest.FixtureRequest) -> str | None:
    from tests.support.asgi import AsgiRpc

    return request.getfixturevalue("loop_runs") if isinstance(request.getfixturevalue("poll_rpc"), AsgiRpc) else None


def test_an_update_answers_then_resumes_with_its_events_on_both_paths(poll_rpc, loop_served, published, request):
    task = waiting_task(owner="anonymous", keys=["a", "b"])
    assert poll_rpc.tasks_update(task.id, {"a": accept(v=1), "ghost": accept()}).result["resultType"] == "complete"
    task.refresh_from_db()
    assert task.status == "input_required"
    states = dict(InputRequest.objects.filter(task=task).values_list("key", "state"))
    assert states == {"a": "answered", "b": "pending"}
    assert InputRequest.objects.get(task=task, key="a").response == accept(v=1)
    (noted,) = TaskEvent.objects.filter(task=task, kind="input")
    assert (noted.actor, noted.detail) == ("client:anonymous", {"keys": ["a"]})
    assert _runs_published(poll_rpc, published, _loop_queue(request)) == []  # a partial answer starts nothing

    assert poll_rpc.tasks_update(task.id, {"b": accept(v=2)}).result["resultType"] == "complete"
    task.refresh_from_db()
    assert (task.status, task.status_message) == ("working", "")
    assert task.dispatched_at is not None
    events = list(TaskEvent.objects.filter(task=task).order_by("id").values_list("kind", "from_status", "to_status"))
    assert events[-2:] == [("input", "", ""), ("transition", "input_required", "working")]
    assert _runs_published(poll_rpc, published, _loop_queue(request)) == [task.id]

    # Answered already, and the task no longer waits: acknowledged, nothing moves.
    assert poll_rpc.tasks_update(task.id, {"b": accept(v=3)}).result["resultType"] == "complete"
    assert InputRequest.objects.get(task=task, key="b").response == accept(v=2)
    assert TaskEvent.objects.filter(task=task, kind="input").count() == 2
    assert _runs_published(poll_rpc, published, _loop_queue(request)) == [task.id]
    _served_on_the_loop(poll_rpc, loop_served, 3)


def test_a_malformed_answer_refuses_the_whole_update_on_both_paths(poll_rpc, loop_served):
    task = waiting_task(owner="anonymous", keys=["a", "b"])
    refused = poll_rpc.tasks_update(task.id, {"a": accept(), "b": {"action": "maybe"}})
    assert refused.error["code"] == -32602
    assert set(InputRequest.objects.filter(task=task).values_list("state", flat=True)) == {"pending"}
    assert not TaskEvent.objects.filter(task=task, kind="input").exists()
    assert poll_rpc.request("tasks/update", {"taskId": task.id}).error["code"] == -32602
    assert poll_rpc.tasks_update(task.id, ["a"]).error["code"] == -32602
    assert poll_rpc.tasks_update("no-such-task", {"a": accept()}).error["code"] == -32602
    _served_on_the_loop(poll_rpc, loop_served, 4)


def test_an_update_of_a_finished_task_is_acknowledged_and_changes_nothing_on_both_paths(poll_rpc, loop_served):
    task = cancelled_task(owner="anonymous")
    assert poll_rpc.tasks_update(task.id, {"anything": accept()}).result["resultType"] == "complete"
    assert Task.objects.get(pk=task.id).status == "cancelled"
    assert not TaskEvent.objects.filter(task=task, kind="input").exists()
    _served_on_the_loop(poll_rpc, loop_served, 1)


def test_listeners_hear_the_shorter_list_after_a_partial_answer_on_both_paths(poll_rpc, loop_served):
    from mcptasks import signals

    heard: list[tuple[str, dict]] = []

    def listen(*, kind: str, pending_inputs: dict, **_: object) -> None:
        heard.append((kind, dict(pending_inputs or {})))

    signals.task_changed.connect(listen, weak=False)
    try:
        task = waiting_task(owner="anonymous", keys=["a", "b"])
        heard.clear()
        poll_rpc.tasks_update(task.id, {"a": accept()})
    finally:
        signals.task_changed.disconnect(listen)
    assert [(kind, set(pending)) for kind, pending in heard] == [("input", {"b"})]
    assert heard[0][1]["b"]["method"] == "elicitation/create"
    _served_on_the_loop(poll_rpc, loop_served, 1)


@postgres_only.LOOP_POLLS
def test_two_updates_at_once_each_answering_one_question_resume_the_task_once(loop_runs):
    """The second update waits on the task's row lock, then reads the
    questions afresh: it sees the first's answer and resumes the task, where
    a single statement's older snapshot would leave it waiting forever."""
    import asyncio

    from asgiref.sync import async_to_sync

    from mcptasks.tasks import lifecycle

    task = waiting_task(owner="anonymous", keys=["a", "b"])

    async def both() -> list[list[str]]:
        return list(
            await asyncio.gather(
                lifecycle.asubmit_input(task.id, {"a": accept()}, actor="client:anonymous"),
                lifecycle.asubmit_input(task.id, {"b": accept()}, actor="client:anonymous"),
            )
        )

    assert sorted(async_to_sync(both)()) == [["a"], ["b"]]
    task.refresh_from_db()
    assert task.status == "working"
    assert TaskEvent.objects.filter(task=task, kind="transition", to_status="working").count() == 1
    url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert redis.Redis.from_url(url).llen(loop_runs) == 1


def test_the_asgi_route_looks_for_every_method_the_loop_serves():
    from mcptasks.protocol.modern import handlers
    from mcptasks.web import asgi

    assert {method.decode() for method in asgi._LOOP_METHODS} == set(handlers.LOOP_METHODS)


@postgres_only.LOOP_POLLS
def test_the_update_throttle_counts_on_the_loop_through_a_database_cache(settings, loop_runs, loop_served):
    """``THROTTLE_RATES["update"]`` counted in a cache that is an ORM call
    (Django's database cache, ``THROTTLE_SYNC_MS`` 0): on the loop its count
    is awaited on a thread, so the third cancel is refused, not served
    uncounted (on the loop itself the ORM would raise)."""
    from django.core.management import call_command

    from tests.support.asgi import AsgiRpc
    from tests.test_limits import assert_rate_limited

    settings.CACHES = {
        **settings.CACHES,
        "db-throttle": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "mcptasks_test_throttle"},
    }
    call_command("createcachetable", "mcptasks_test_throttle", verbosity=0)
    settings.MCPTASKS = {
        **settings.MCPTASKS,
        "THROTTLE_CACHE": "db-throttle",
        "THROTTLE_SYNC_MS": 0,
        "POLL_BURST": 0,
        "THROTTLE_RATES": {"update": "2/m"},
    }
    client = AsgiRpc()
    client.request("server/discover")  # identifies the caller, on a thread
    tasks = [running_task(owner="anonymous") for _ in range(3)]
    loop_served.clear()
    assert client.tasks_cancel(tasks[0].id).ok
    assert client.tasks_cancel(tasks[1].id).ok
    assert_rate_limited(client.tasks_cancel(tasks[2].id), at_most_seconds=60)
    assert Task.objects.get(pk=tasks[2].id).status == "working", "a refused cancel cancels nothing"
    assert len(loop_served) == 3
