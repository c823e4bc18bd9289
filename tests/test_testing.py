"""mcptasks.testing, the helper sites unit-test their tools with: it runs the
test site's real tools through the registry, real task rows and the worker's
own run, and sends nothing to the broker."""

from __future__ import annotations

import pytest

from mcptasks import ProtocolError, ToolContext
from mcptasks.models import TaskEvent
from mcptasks.testing import TaskCall, accept, call_tool, decline, run_inline
from tests.support import postgres_only
from tests.support.factories import transitions

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_tool_runs_to_completed_as_a_task(published):
    call = call_tool("slow_compute", {"seconds": 0, "label": "unit"})
    assert isinstance(call, TaskCall)
    assert call.status == "completed"
    assert call.runs == ["completed"]
    assert call.text == "computed unit in 0.0s"
    assert call.is_error is False
    assert call.result["content"] == [{"type": "text", "text": "computed unit in 0.0s"}]
    polled = call.poll()
    assert (polled["taskId"], polled["status"]) == (call.task_id, "completed")
    assert polled["result"]["resultType"] == "complete"
    # Real rows, written by the domain and the worker's run.
    assert transitions(call.task_id) == [("", "working"), ("working", "completed")]
    assert TaskEvent.objects.filter(task_id=call.task_id, kind="run_started").count() == 1
    assert call.task.owner == "testing"
    assert published == [], "the run was made here, not sent to a broker"


def test_questions_are_answered_by_key_and_the_task_runs_again(published):
    call = call_tool("confirm_delete", {"filename": "a.txt"})
    assert call.status == "input_required"
    assert set(call.questions) == {"confirm"}
    question = call.questions["confirm"]
    assert question["method"] == "elicitation/create" and "a.txt" in question["params"]["message"]
    assert call.answer(confirm=accept(confirm=True)) is call
    assert call.status == "completed"
    assert call.text == "Deleted a.txt"
    assert call.runs == ["input_required", "completed"]
    assert call.questions == {}
    assert published == [], "the answered task's run was made here, not sent to a broker"


def test_partial_answers_keep_the_task_waiting():
    call = call_tool("multi_input")
    assert set(call.questions) == {"first", "second"}
    call.answer({"first": accept(name="Ada")})
    assert call.status == "input_required"
    assert set(call.questions) == {"second"}
    assert call.runs == ["input_required"], "no run while a question is open"
    call.answer(second=accept(name="Lovelace"))
    assert call.text == "Got Ada and Lovelace."


def test_a_declined_question_is_an_answer():
    call = call_tool("confirm_delete", {"filename": "keep.txt"}).answer(confirm=decline())
    assert call.text == "Kept keep.txt"


def test_a_malformed_answer_is_refused_and_the_task_keeps_waiting():
    call = call_tool("confirm_delete", {"filename": "typo.txt"})
    with pytest.raises(ProtocolError) as info:
        call.answer(confirm=12345)
    assert info.value.code == -32602
    assert call.status == "input_required"


def test_a_tool_error_and_a_protocol_error():
    failed_tool = call_tool("failing_job")
    assert failed_tool.status == "completed" and failed_tool.is_error is True
    assert "simulated tool error" in failed_tool.text
    failed = call_tool("protocol_error_job")
    assert failed.status == "failed"
    assert failed.error == {"code": -32603, "message": "Simulated protocol error during execution"}
    with pytest.raises(AssertionError, match="failed, not completed"):
        _ = failed.result


def test_a_client_that_declares_nothing_is_not_asked():
    call = call_tool("confirm_delete", {"filename": "x"}, capabilities={})
    assert call.status == "failed"
    assert call.error["code"] == -32021


def test_bad_calls_are_refused_as_tools_call_refuses_them():
    with pytest.raises(ProtocolError) as unknown:
        call_tool("no_such_tool")
    assert unknown.value.code == -32602
    with pytest.raises(ProtocolError) as bad:
        call_tool("slow_compute", {"seconds": "soon"})
    assert bad.value.code == -32602
    with pytest.raises(ValueError, match="run_inline"):
        call_tool("greet", {"name": "x"})


def test_a_task_cancelled_before_its_run_never_runs():
    call = call_tool("slow_compute", {"seconds": 30}, run=False)
    assert call.status == "working" and call.runs == []
    assert call.cancel() is True
    assert call.run().runs == ["skipped"]
    assert call.status == "cancelled"
    assert call.cancel() is False


def test_status_messages_and_the_user(temp_tool, django_user_model):
    user = django_user_model.objects.create_user("ada")

    @temp_tool(task="required", description="Says who called.")
    async def whoami(ctx: ToolContext) -> str:
        ctx.report_status("looking")
        return f"{ctx.user.username} ({ctx.owner})"

    call = call_tool("whoami", user=user)
    assert call.text == f"ada (user:{user.pk})"
    assert call.status_message is None, "a finished task shows no status message"
    inline = run_inline("whoami", user=user)
    assert inline.text == f"ada (user:{user.pk})"


def test_the_inline_way_asks_in_rounds():
    first = run_inline("test_input_required_result_elicitation")
    assert first.result_type == "input_required"
    (key,) = first.questions
    with pytest.raises(AssertionError, match="waiting for answers"):
        _ = first.result
    done = first.answer({key: accept(name="Grace")})
    assert done.result_type == "complete"
    assert "Grace" in done.text
    assert done.answers == {key: accept(name="Grace")}
    assert run_inline("greet", {"name": "inline"}).text == "Hello, inline!"


@pytest.mark.django_db(transaction=False)
def test_uncommitted_rows_are_refused_with_a_clear_message():
    with pytest.raises(RuntimeError, match=r"django_db\(transaction=True\)"):
        call_tool("slow_compute", {"seconds": 0})


@postgres_only.SESSIONS
def test_a_call_leaves_no_connection_of_its_own_behind(published, monkeypatch):
    """Django's test runner drops the test database right after the tests: a
    run's status writer must have let its connection go by then."""
    from django.db import connection

    from mcptasks.worker import progress

    written: list[str] = []
    write = progress.lifecycle.set_status_message

    def counted(task_id: str, message: str, **options: object) -> object:
        written.append(message)
        return write(task_id, message, **options)

    monkeypatch.setattr(progress.lifecycle, "set_status_message", counted)
    call = call_tool("count_to", {"n": 4, "step_seconds": 0.1})
    assert call.status == "completed"
    assert written, "the writer wrote a status message (so it had a connection)"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND query LIKE 'UPDATE mcptasks_task SET status_message%%'"
        )
        assert cursor.fetchone()[0] == 0
