"""The official Python SDK's 2025-11-25 client (``mcp==1.30.0``) against the
live stack (uvicorn, a Celery worker, Postgres, Redis).

The SDK initializes a session, calls the example tools as tasks
(``session.experimental.call_tool_as_task``), polls them (``poll_task``),
answers their elicitation and sampling requests through its callbacks while
``get_task_result`` blocks, lists and cancels them; and calls tools without a
task, which ask the client on the POST's own stream. Each scenario runs in
the SDK's own virtualenv (tests/support/legacy_sdk.py) and reports what it
observed; the tests here check it, and the database behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import postgres_only
from tests.support.legacy_sdk import run_client, sdk_python

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

RELATED = "io.modelcontextprotocol/related-task"
SCENARIOS = (
    "capabilities",
    "complete",
    "elicitation",
    "sampling",
    "failure",
    "cancel",
    "list",
    "notifications",
    "plain",
)


@pytest.fixture(scope="module")
def python() -> Path:
    return sdk_python()


@pytest.fixture(scope="module")
def observed(python: Path, live_stack: Any) -> dict[str, Any]:
    """Every scenario, in one SDK session, as an anonymous caller."""
    return run_client(python, live_stack.url, *SCENARIOS)


def scenario(observed: dict[str, Any], name: str) -> dict[str, Any]:
    data = observed[name]
    assert "exception" not in data, data.get("traceback", data)
    return data


def test_the_sdk_negotiates_tasks(observed):
    data = scenario(observed, "capabilities")
    assert data["protocolVersion"] == "2025-11-25"
    assert data["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    support = data["taskSupport"]
    assert support["greet"] == "forbidden"
    assert support["slow_compute"] == "optional"
    assert support["confirm_delete"] == "required"


def test_a_task_completes(observed, live_stack):
    data = scenario(observed, "complete")
    created = data["created"]["task"]
    assert created["status"] == "working" and created["ttl"] == 120_000 and created["pollInterval"] > 0
    assert data["statuses"][-1] == "completed"
    assert data["final"]["status"] == "completed"
    assert data["text"] == "computed sdk in 0.5s"
    assert data["result"]["_meta"][RELATED] == {"taskId": created["taskId"]}
    row = live_stack.task_row(created["taskId"])
    assert row["era"] == "2025-11-25" and row["status"] == "completed" and row["ttl_ms"] == 120_000


def test_a_task_elicits_through_tasks_result(observed, live_stack):
    data = scenario(observed, "elicitation")
    task_id = data["created"]["task"]["taskId"]
    assert "input_required" in data["statuses"]
    assert data["text"] == "Deleted report.txt"
    assert data["final"]["status"] == "completed"
    (request,) = data["elicitations"]
    assert request["message"] == "Delete report.txt?"
    assert request["_meta"][RELATED] == {"taskId": task_id}
    rows = live_stack.query("SELECT key, state, response FROM mcptasks_inputrequest WHERE task_id = %s", (task_id,))
    assert [(r["key"], r["state"]) for r in rows] == [("confirm", "answered")]
    assert rows[0]["response"] == {"action": "accept", "content": {"confirm": True}}


def test_a_task_samples_through_tasks_result(observed, live_stack):
    data = scenario(observed, "sampling")
    task_id = data["created"]["task"]["taskId"]
    assert data["text"] == "Summary: Tasks travel well."
    (request,) = data["samplings"]
    assert request["maxTokens"] == 60
    assert request["_meta"][RELATED] == {"taskId": task_id}
    assert live_stack.task_row(task_id)["status"] == "completed"


def test_a_tool_error_fails_the_task(observed):
    data = scenario(observed, "failure")
    assert data["final"]["status"] == "failed"
    assert "simulated tool error" in data["final"]["statusMessage"]
    assert data["result"]["isError"] is True, "tasks/result is the tool's own result"
    assert data["protocol_error"]["statuses"][-1] == "failed"
    assert data["protocol_error"]["error"] == {"code": -32603, "message": "Simulated protocol error during execution"}


def test_a_task_is_cancelled_before_the_answer(observed, live_stack):
    data = scenario(observed, "cancel")
    assert data["cancelled"]["status"] == "cancelled"
    assert data["after"]["status"] == "cancelled"
    assert data["cancel_again"]["code"] == -32602
    assert live_stack.task_row(data["task_id"])["status"] == "cancelled"


def test_tasks_are_listed(observed):
    data = scenario(observed, "list")
    assert set(data["created"]) <= set(data["listed"])
    assert data["listed"][:3] == list(reversed(data["created"])), "newest first"
    assert data["bad_cursor"] == -32602
    everything = {
        scenario(observed, name)["created"]["task"]["taskId"] for name in ("complete", "elicitation", "sampling")
    }
    assert everything <= set(data["listed"]), "one session's tasks are all listed"


def test_status_notifications_reach_the_session_stream(observed):
    data = scenario(observed, "notifications")
    assert data["statuses"][-1] == "completed", data
    for params in data["params"]:
        assert RELATED not in params.get("_meta", {})
        assert {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl"} <= set(params)


def test_plain_calls_ask_the_client_on_their_own_stream(observed):
    data = scenario(observed, "plain")
    assert data["elicitation"] == (
        'User response: action=accept, content={"username": "sdk-user", "email": "sdk@example.com"}'
    )
    assert data["sampling"] == "LLM response: Tasks travel well."
    assert data["logs"] == ["Tool execution started", "Tool processing data", "Tool execution completed"]
    assert data["progress"] == [0, 50, 100]


def test_a_second_identity_sees_none_of_the_first(python, live_stack):
    alice = live_stack.create_user_token("legacy-sdk-alice")
    bob = live_stack.create_user_token("legacy-sdk-bob")
    mine = run_client(python, live_stack.url, "list", token=alice)["list"]
    assert "exception" not in mine, mine
    task_id = mine["created"][0]
    theirs = run_client(python, live_stack.url, "peek", token=bob, task_id=task_id)["peek"]
    assert theirs["listed"] == []
    assert theirs["errors"] == {"get": -32602, "cancel": -32602, "result": -32602}
    # Alice, in a new session, still sees all of hers.
    again = run_client(python, live_stack.url, "peek", token=alice, task_id=task_id)["peek"]
    assert set(mine["created"]) <= set(again["listed"])
    assert again["errors"]["get"] is None
    owners = {
        row["owner"]
        for row in live_stack.query("SELECT owner FROM mcptasks_task WHERE id = ANY(%s)", (mine["created"],))
    }
    assert len(owners) == 1 and owners != {"anonymous"}
