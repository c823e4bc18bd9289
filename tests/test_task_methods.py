"""The task methods (``protocol/task_methods.py``) serve both eras: a
2025-era task read or cancelled through either era's methods, on the thread
and on the event loop (``poll_rpc``), gets one owner check, one validation,
one error mapping and one poll throttle; each era only shapes the answer."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from mcptasks.errors import RATE_LIMITED, InvalidParams, TaskNotFound
from mcptasks.models import Task, TaskEvent, TaskStatus
from mcptasks.protocol import task_methods
from mcptasks.protocol.caller import Caller
from mcptasks.tasks import lifecycle
from mcptasks.worker.execution import run_task
from tests.support.legacy import DjangoLegacy

pytestmark = pytest.mark.django_db(transaction=True)

NOT_FOUND = {"code": -32602, "message": "Failed to retrieve task: Task not found"}


def session_of(client, username: str) -> tuple[DjangoLegacy, str]:
    user, _ = get_user_model().objects.get_or_create(username=username)
    token = Token.objects.get_or_create(user=user)[0].key
    session = DjangoLegacy(client, token=token)
    session.initialize()
    return session, token


def test_a_2025_task_read_through_either_era_has_one_owner_check(client, poll_rpc, settings, caplog):
    alice, alice_token = session_of(client, "alice")
    bob, bob_token = session_of(client, "bob")
    task_id = alice.create_task("slow_compute", {"seconds": 0, "label": "both"})

    legacy = alice.request("tasks/get", {"taskId": task_id}).result
    modern = poll_rpc.tasks_get(task_id, token=alice_token).result
    assert legacy["taskId"] == modern["taskId"] == task_id
    assert legacy["status"] == modern["status"] == TaskStatus.WORKING
    assert (legacy["ttl"], legacy["pollInterval"]) == (modern["ttlMs"], modern["pollIntervalMs"])

    for wanted in (task_id, "no-such-task", "a" * 65, "ab\x00"):  # someone else's, unknown, never storable
        assert bob.request("tasks/get", {"taskId": wanted}).error == NOT_FOUND
        assert poll_rpc.tasks_get(wanted, token=bob_token).error == NOT_FOUND
    for malformed in (5, "", None):
        legacy_error = bob.request("tasks/get", {"taskId": malformed}).error
        assert legacy_error == poll_rpc.tasks_get(malformed, token=bob_token).error
        assert legacy_error == {"code": -32602, "message": '"taskId" (a string) is required'}

    # One poll throttle per owner and task, whichever era polls.
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": 1}
    time.sleep(1.05 - time.time() % 1)  # early in a window of the task's 1 s interval
    assert alice.request("tasks/get", {"taskId": task_id}).status == 200
    refused = poll_rpc.tasks_get(task_id, token=alice_token)
    assert refused.status == 429 and refused.error["code"] == RATE_LIMITED, refused

    # The outcome: the 2025 era's tasks/get does not show it (tasks/result
    # does); the 2026 era's does, its first read marked once, each audited.
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": None}
    run_task(task_id)
    assert "result" not in alice.request("tasks/get", {"taskId": task_id}).result
    assert not TaskEvent.objects.filter(task_id=task_id, kind="result_retrieved").exists()
    settings.LOGGING_CONFIG = None  # an in-process ASGI request would configure logging again
    caplog.set_level(logging.INFO, logger="mcptasks.audit")
    for _ in range(2):
        assert poll_rpc.tasks_get(task_id, token=alice_token).result["result"]["content"]
    assert len([r for r in caplog.records if r.name == "mcptasks.audit" and task_id in r.getMessage()]) == 2
    assert TaskEvent.objects.filter(task_id=task_id, kind="result_retrieved").count() == 1


def test_a_2025_task_cancelled_through_either_era(client, poll_rpc):
    alice, alice_token = session_of(client, "alice")
    bob, bob_token = session_of(client, "bob")
    task_id = alice.create_task("slow_compute", {"seconds": 60})

    assert bob.request("tasks/cancel", {"taskId": task_id}).error == NOT_FOUND
    assert poll_rpc.tasks_cancel(task_id, token=bob_token).error == NOT_FOUND
    assert Task.objects.get(pk=task_id).status == TaskStatus.WORKING

    assert poll_rpc.tasks_cancel(task_id, token=alice_token).result["resultType"] == "complete"
    assert alice.request("tasks/get", {"taskId": task_id}).result["status"] == TaskStatus.CANCELLED
    # Cancelling a finished task: the 2025 era shapes it as an error, the 2026 era as done.
    error = alice.request("tasks/cancel", {"taskId": task_id}).error
    assert error["code"] == -32602 and "'cancelled'" in error["message"]
    assert poll_rpc.tasks_cancel(task_id, token=alice_token).result["resultType"] == "complete"
    assert TaskEvent.objects.filter(task_id=task_id, to_status=TaskStatus.CANCELLED).count() == 1


def test_the_thread_route_runs_a_method_where_it_is_called():
    """``now`` drives a method whose steps are plain calls; a step that would
    suspend (work for an event loop) is refused, never dropped half done."""

    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        task_methods.now(suspends())
    caller = Caller(owner="nobody")
    with pytest.raises(TaskNotFound):
        task_methods.now(task_methods.get(task_methods.THREAD, caller, {"taskId": "missing"}, lambda task: task))
    task = lifecycle.create_task(owner="nobody", tool_name="slow_compute", arguments={}, enqueue=False)
    with pytest.raises(InvalidParams, match="inputResponses"):
        task_methods.now(task_methods.update(task_methods.THREAD, caller, {"taskId": task.id}))
