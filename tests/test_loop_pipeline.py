"""The event loop's pipeline (``protocol/modern/on_loop.py``): a task tool's
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
from tests.support.factories import running_task, waiting_task
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
