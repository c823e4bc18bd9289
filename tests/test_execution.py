"""One run of a task (mcptasks.worker.execution.run_task), in this process.

``run_task`` is exactly what the Celery task calls; here it runs in the test
process (and in threads), on committed rows, so its lease monitor thread sees
what a worker would.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from mcptasks import ToolContext, signals
from mcptasks.models import InputRequest, InputRequestState, Task, TaskEvent, TaskStatus
from mcptasks.tasks import lifecycle
from mcptasks.testing import call_tool
from mcptasks.worker.execution import run_task
from tests.support.factories import accept, make_task, terminal_transitions, transitions
from tests.support.rpc import FULL_CAPS, TASKS_CAPS
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("transition_paths")]

CAPS = FULL_CAPS


def new_task(tool_name: str, arguments: dict | None = None, caps: dict | None = None) -> Task:
    return make_task(tool=tool_name, arguments=arguments or {}, client_capabilities=caps or CAPS)


def get(task: Task) -> Task:
    return Task.objects.get(pk=task.id)


def text_of(task: Task) -> str:
    return " ".join(block.get("text", "") for block in task.result["content"])


class Background:
    """run_task in a thread, with its own database connection."""

    def __init__(self, task_id: str) -> None:
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(task_id,), daemon=True)
        self.thread.start()

    def _run(self, task_id: str) -> None:
        try:
            self.outcome = run_task(task_id)
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            connection.close()

    def join(self, timeout: float) -> str | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not stop within {timeout}s"
        if self.error is not None:
            raise self.error
        return self.outcome


# Outcomes ---------------------------------------------------------------------------------


def test_a_run_completes_the_task():
    task = new_task("slow_compute", {"seconds": 0, "label": "quick"})
    assert run_task(task.id) == "completed"
    task = get(task)
    assert task.status == TaskStatus.COMPLETED
    assert task.result["isError"] is False
    assert "quick" in text_of(task)
    assert (task.lease_owner, task.lease_expires_at, task.attempts) == ("", None, 1)
    assert transitions(task.id) == [("", "working"), ("working", "completed")]
    assert TaskEvent.objects.filter(task=task, kind="run_started").count() == 1


def test_a_tool_error_ends_completed_with_is_error():
    task = new_task("failing_job")
    assert run_task(task.id) == "tool_error"  # the run's outcome (telemetry), not the wire's status
    task = get(task)
    assert task.status == TaskStatus.COMPLETED
    assert task.tool_error is True
    assert task.result["isError"] is True
    assert task.result["content"] and task.error is None


def test_an_unexpected_exception_is_a_tool_error(temp_tool):
    @temp_tool(task="required", description="Crash.")
    def crashing_tool() -> str:
        raise RuntimeError("kaboom")

    task = new_task("crashing_tool")
    assert run_task(task.id) == "tool_error"
    task = get(task)
    assert task.status == TaskStatus.COMPLETED
    assert task.result["isError"] is True
    assert "kaboom" in text_of(task)


def test_a_protocol_error_fails_the_task():
    task = new_task("protocol_error_job")
    assert run_task(task.id) == "failed"
    task = get(task)
    assert task.status == TaskStatus.FAILED
    assert task.error["code"] == -32603
    assert isinstance(task.error["message"], str) and task.error["message"]
    assert task.result is None
    assert task.status_message


def test_unknown_tool_fails_the_task():
    task = new_task("tool_that_was_removed")
    assert run_task(task.id) == "failed"
    task = get(task)
    assert task.status == TaskStatus.FAILED
    assert task.error["code"] == -32602


def test_terminal_or_waiting_tasks_are_not_run():
    done = new_task("slow_compute", {"seconds": 0})
    assert run_task(done.id) == "completed"
    assert run_task(done.id) == "skipped"
    waiting = new_task("confirm_delete", {"filename": "a.txt"})
    assert run_task(waiting.id) == "input_required"
    assert run_task(waiting.id) == "skipped"
    assert get(waiting).attempts == 0


# Input -------------------------------------------------------------------------------------------


def test_elicitation_round_trip_replays_the_answer_by_key():
    task = new_task("confirm_delete", {"filename": "report.txt"})
    assert run_task(task.id) == "input_required"
    task = get(task)
    assert task.status == TaskStatus.INPUT_REQUIRED
    pending = InputRequest.objects.get(task=task, state=InputRequestState.PENDING)
    assert pending.key == "confirm"
    assert pending.method == "elicitation/create"
    assert "report.txt" in pending.params["message"]
    assert lifecycle.submit_input(task.id, {"confirm": accept(confirm=True)}, actor="client:alice") == ["confirm"]
    assert run_task(task.id) == "completed"
    task = get(task)
    assert task.status == TaskStatus.COMPLETED
    assert "report.txt" in text_of(task)
    assert transitions(task.id) == [
        ("", "working"),
        ("working", "input_required"),
        ("input_required", "working"),
        ("working", "completed"),
    ]


def test_two_questions_at_once_and_partial_answers():
    call = call_tool("multi_input", capabilities=CAPS)
    assert set(call.questions) == {"first", "second"}
    call.answer(first=accept(name="Ada"))
    assert call.status == TaskStatus.INPUT_REQUIRED
    assert call.run().runs == ["input_required", "skipped"]
    call.answer(second=accept(name="Lovelace"))
    assert call.status == TaskStatus.COMPLETED
    assert call.text == "Got Ada and Lovelace."


def test_a_task_never_asks_for_input_the_client_did_not_declare():
    call = call_tool("confirm_delete", {"filename": "x"}, capabilities=TASKS_CAPS)
    assert call.runs == ["failed"]
    assert call.status == TaskStatus.FAILED
    assert call.error["code"] == -32021
    assert "elicitation" in call.error["data"]["requiredCapabilities"]
    assert not InputRequest.objects.filter(task_id=call.task_id).exists()


def test_mrtr_answers_reach_the_task_run(client):
    from tests.support.rpc import DjangoRpc

    rpc = DjangoRpc(client)
    first = rpc.call_tool("test_tool_with_task", {}).result
    (key,) = first["inputRequests"]
    created = rpc.call_tool(
        "test_tool_with_task",
        {},
        extra={"inputResponses": {key: accept(name="Alice")}, "requestState": first["requestState"]},
    ).result
    assert created["resultType"] == "task"
    assert run_task(created["taskId"]) == "completed"
    final = rpc.tasks_get(created["taskId"]).result
    assert final["status"] == "completed"
    assert "Alice" in final["result"]["content"][0]["text"]


# The context -------------------------------------------------------------------------------------


def test_a_tool_sees_the_same_user_inline_and_in_its_task_run(client, token_for, temp_tool):
    from rest_framework.authtoken.models import Token

    from tests.support.rpc import NO_CAPS, DjangoRpc

    seen: list[tuple] = []

    @temp_tool(task="optional", description="Says who calls.")
    def who_calls(ctx: ToolContext) -> str:
        seen.append((ctx.owner, ctx.user, ctx.in_task))
        return "ok"

    token = token_for("carol")
    user = Token.objects.get(key=token).user
    rpc = DjangoRpc(client, token=token)
    assert rpc.call_tool("who_calls", capabilities=NO_CAPS).result["resultType"] == "complete"
    assert run_task(rpc.create_task("who_calls")) == "completed"
    owner = f"user:{user.pk}"
    assert seen == [(owner, user, False), (owner, user, True)]


@pytest.mark.parametrize("owner", ["alice", "user:999999", "user:not-a-key"])
def test_a_task_run_has_no_user_when_its_owner_is_none(owner, temp_tool):
    seen: list = []

    @temp_tool(task="required", description="Says who calls.")
    def who_runs(ctx: ToolContext) -> str:
        seen.append(ctx.user)
        return "ok"

    assert run_task(make_task(owner=owner, tool="who_runs").id) == "completed"
    assert seen == [None]


# Cancellation and leases ----------------------------------------------------------------------------------


def test_cancel_stops_a_running_tool_promptly():
    task = new_task("slow_compute", {"seconds": 30, "label": "long"})
    run = Background(task.id)
    wait_until(lambda: get(task).lease_owner != "")
    started = time.monotonic()
    assert lifecycle.cancel(task.id, actor="client:alice")
    assert run.join(timeout=5) == "cancelled"
    stopped_after = time.monotonic() - started
    print(f"run stopped {stopped_after:.3f}s after the cancel")
    assert stopped_after < 2
    assert get(task).status == TaskStatus.CANCELLED
    assert terminal_transitions(task.id) == [("working", "cancelled")]


def test_a_duplicate_message_does_not_start_a_second_run():
    task = new_task("slow_compute", {"seconds": 30})
    run = Background(task.id)
    wait_until(lambda: get(task).lease_owner != "")
    assert run_task(task.id) == "skipped"
    assert get(task).attempts == 1
    lifecycle.cancel(task.id, actor="client:alice")
    assert run.join(timeout=5) == "cancelled"


def test_the_lease_is_renewed_while_the_tool_runs(settings, temp_tool):
    settings.MCPTASKS = {**settings.MCPTASKS, "LEASE_SECONDS": 1.5, "HEARTBEAT_SECONDS": 0.2}

    @temp_tool(task="required", description="Longer than a lease.")
    def outlives_lease(ctx: ToolContext) -> str:
        ctx.sleep(3.5)
        return "survived"

    task = new_task("outlives_lease")
    run = Background(task.id)
    wait_until(lambda: get(task).lease_owner != "")
    first_expiry = get(task).lease_expires_at
    time.sleep(2.0)
    assert get(task).lease_expires_at > first_expiry
    assert lifecycle.sweep().redispatched == 0, "a renewed lease is not lapsed"
    assert run.join(timeout=10) == "completed"
    assert text_of(get(task)) == "survived"


def test_a_run_that_lost_its_lease_cannot_finish_the_task(temp_tool):
    release = threading.Event()

    @temp_tool(task="required", description="Waits.")
    def waits_for_release(ctx: ToolContext) -> str:
        ctx.wait(release, timeout=20)
        return "first run"

    task = new_task("waits_for_release")
    run = Background(task.id)
    wait_until(lambda: get(task).lease_owner != "")
    first_owner = get(task).lease_owner
    # The sweeper decided the first worker was dead and another took over.
    Task.objects.filter(pk=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.claim(task.id, worker="second-worker") is not None
    assert run.join(timeout=5) == "cancelled", "the first run must notice it lost the lease"
    release.set()
    task = get(task)
    assert task.status == TaskStatus.WORKING
    assert task.lease_owner == "second-worker" != first_owner
    assert lifecycle.complete(task.id, {"content": [], "isError": False}, worker="second-worker")
    assert len(terminal_transitions(task.id)) == 1


def test_status_messages_reach_the_task(temp_tool):
    go_on = threading.Event()

    @temp_tool(task="required", description="Reports.")
    def reports(ctx: ToolContext) -> str:
        ctx.report_status("halfway there")
        ctx.wait(go_on, timeout=20)
        return "done"

    task = new_task("reports")
    run = Background(task.id)
    wait_until(lambda: get(task).status_message == "halfway there")
    go_on.set()
    assert run.join(timeout=5) == "completed"


def test_an_async_tool_uses_its_context_like_a_sync_one(temp_tool, django_user_model):
    """An ``async def`` tool runs on an event loop, where Django refuses synchronous
    database work: the context's own (a status message, the user's first read) is
    made on a thread of its own."""
    go_on = threading.Event()
    user = django_user_model.objects.create_user("async-ada")

    @temp_tool(task="required", description="Reports, asynchronously.")
    async def reports_async(ctx: ToolContext) -> str:
        ctx.report_status("halfway there")
        while not go_on.is_set():
            await asyncio.sleep(0.02)
        return f"done for {ctx.user.username}"

    task = make_task(owner=f"user:{user.pk}", tool="reports_async", client_capabilities=CAPS)
    run = Background(task.id)
    wait_until(lambda: get(task).status_message == "halfway there")
    go_on.set()
    assert run.join(timeout=5) == "completed"
    task = get(task)
    assert task.result["isError"] is False, task.result
    assert text_of(task) == "done for async-ada"


def test_a_malformed_answer_does_not_fail_the_task(client):
    """An answer that is not an ElicitResult (``12345``) for an outstanding
    elicitation is invalid params for tasks/update (InputResponse schema).
    It must not be taken as the answer: the task keeps waiting for a real
    one and is not failed because of the client's bad request."""
    from tests.support.rpc import DjangoRpc

    rpc = DjangoRpc(client)
    task_id = rpc.create_task("confirm_delete", {"filename": "typo.txt"})
    assert run_task(task_id) == "input_required"
    reply = rpc.tasks_update(task_id, {"confirm": 12345})
    assert reply.error["code"] == -32602, reply
    run_task(task_id)  # whatever a worker would do next
    after = rpc.tasks_get(task_id).result
    assert after["status"] == "input_required", f"a malformed answer ended the task: {after}"
    assert set(after["inputRequests"]) == {"confirm"}
    assert rpc.tasks_update(task_id, {"confirm": accept(confirm=True)}).ok
    assert run_task(task_id) == "completed"
    assert rpc.tasks_get(task_id).result["status"] == "completed"


def test_a_declined_elicitation_is_an_answer():
    call = call_tool("confirm_delete", {"filename": "keep.txt"}, capabilities=CAPS)
    assert call.runs == ["input_required"]
    call.answer(confirm={"action": "decline"})
    assert call.runs == ["input_required", "completed"]
    assert call.is_error is False
    assert call.text == "Kept keep.txt"


@pytest.mark.django_db(transaction=True)
def test_the_change_to_input_required_carries_its_questions(transition_paths, published):
    """A receiver of ``task_changed`` (the notification publisher among them)
    gets the questions of a task that now waits for input, on both backends."""
    heard: list[tuple[str, dict]] = []

    def listen(*, to_status: str, pending_inputs: dict | None, **_: object) -> None:
        heard.append((str(to_status), dict(pending_inputs or {})))

    signals.task_changed.connect(listen, weak=False)
    try:
        task = make_task(
            tool="confirm_delete", arguments={"filename": "x.txt"}, client_capabilities={"elicitation": {}}
        )
        assert run_task(task.id) == "input_required"
    finally:
        signals.task_changed.disconnect(listen)
    waiting = [pending for status, pending in heard if status == "input_required"]
    assert len(waiting) == 1 and set(waiting[0]) == {"confirm"}
