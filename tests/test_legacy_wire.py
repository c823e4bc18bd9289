"""The 2025-era session wire at /mcp, through Django's test client.

Sessions, version negotiation, the 2025-11-25 task methods on the shared
engine, and the client's answers to a task's questions. Streamed responses
(plain calls that ask the client, a blocked tasks/result, the GET stream)
need a live server: tests/test_live_legacy.py. Every JSON reply is validated
against the pinned 2025-11-25 schema by the client (tests/support/legacy.py).
"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from mcptasks.models import Era, InputRequest, InputRequestState, LegacySession, LegacyTask, Task, TaskStatus
from mcptasks.protocol.legacy import handlers as legacy
from mcptasks.protocol.legacy import tasks as legacy_tasks
from mcptasks.tasks import lifecycle
from mcptasks.worker.execution import run_task
from tests.support.legacy import CAPS, RELATED, DjangoLegacy
from tests.support.rpc import FULL_CAPS

pytestmark = pytest.mark.django_db(transaction=True)

VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]+$")


@pytest.fixture
def mcp(client) -> DjangoLegacy:
    session = DjangoLegacy(client)
    session.initialize()
    return session


def token_for(username: str) -> str:
    user, _ = get_user_model().objects.get_or_create(username=username)
    return Token.objects.get_or_create(user=user)[0].key


def user_session(client, username: str) -> DjangoLegacy:
    session = DjangoLegacy(client, token=token_for(username))
    session.initialize()
    return session


def assert_error(reply, code: int, status: int = 200) -> dict:
    assert reply.status == status, reply
    assert reply.error["code"] == code, reply
    assert reply.error["message"]
    return reply.error


def run(task_id: str) -> Task:
    """One run of the task, in this process (what the worker would do)."""
    run_task(task_id)
    return Task.objects.get(pk=task_id)


# Initialization and sessions -------------------------------------------------------------------------------


def test_initialize_opens_a_session_with_the_task_capability(client):
    session = DjangoLegacy(client)
    reply = session.initialize(initialized=False)
    result = reply.result
    assert result["protocolVersion"] == "2025-11-25"
    assert "resultType" not in result
    assert result["serverInfo"]["name"]
    caps = result["capabilities"]
    assert caps["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert caps["resources"]["subscribe"] is True
    assert {"tools", "prompts", "completions", "logging"} <= set(caps)
    assert VISIBLE_ASCII.match(session.session_id)
    row = LegacySession.objects.get(pk=session.session_id)
    assert row.protocol_version == "2025-11-25"
    assert row.client_capabilities == CAPS
    assert row.client_info["name"] == "mcptasks-legacy-tests"
    assert row.initialized_at is None
    assert session.notify("notifications/initialized").status == 202
    assert LegacySession.objects.get(pk=session.session_id).initialized_at is not None


@pytest.mark.parametrize(
    ("requested", "negotiated"),
    [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
        ("1.0.0", "2025-11-25"),
    ],
)
def test_version_negotiation(client, requested, negotiated):
    session = DjangoLegacy(client)
    result = session.initialize(requested).result
    assert result["protocolVersion"] == negotiated
    assert ("tasks" in result["capabilities"]) == (negotiated == "2025-11-25")


def test_ping_and_set_level_return_exactly_an_empty_result(mcp):
    assert mcp.request("ping").result == {}
    assert mcp.request("logging/setLevel", {"level": "warning"}).result == {}
    assert LegacySession.objects.get(pk=mcp.session_id).log_level == "warning"
    assert_error(mcp.request("logging/setLevel", {"level": "loud"}), -32602)
    assert_error(mcp.request("logging/setLevel", {}), -32602)


def test_ping_needs_no_session(client):
    session = DjangoLegacy(client)
    assert session.request("ping", session=False).result == {}


def test_a_request_without_a_session_is_400(client):
    session = DjangoLegacy(client)
    reply = session.request("tools/list")
    assert reply.status == 400, reply
    assert reply.error["code"] == -32600


def test_unknown_ended_and_foreign_sessions_are_404(client):
    session = DjangoLegacy(client)
    session.session_id = "no-such-session"
    assert session.request("tools/list").status == 404
    assert session.delete().status == 404

    alice = user_session(client, "alice")
    assert alice.request("tools/list").status == 200
    # The same session id under another identity does not exist.
    mallory = DjangoLegacy(client, token=token_for("mallory"))
    mallory.session_id = alice.session_id
    assert mallory.request("tools/list").status == 404
    assert mallory.delete().status == 404
    assert alice.request("ping").status == 200

    assert alice.delete().status == 200
    assert alice.request("tools/list").status == 404
    assert alice.notify("notifications/initialized").status == 404
    assert alice.delete().status == 404


def test_batches_and_garbage_are_refused(mcp):
    reply = mcp.post([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    assert reply.status == 400 and reply.error["code"] == -32600
    reply = mcp.post({"jsonrpc": "1.0", "id": 1, "method": "ping"})
    assert reply.status == 400 and reply.error["code"] == -32600


def test_unknown_and_modern_only_methods_are_method_not_found(mcp):
    for method in ("unknown/method", "server/discover", "subscriptions/listen", "tasks/update"):
        assert_error(mcp.request(method, {}), -32601)


# Tools -----------------------------------------------------------------------------------------------


def test_tools_list_shows_task_support(mcp):
    reply = mcp.request("tools/list")
    tools = {t["name"]: t for t in reply.result["tools"]}
    assert "resultType" not in reply.result and "ttlMs" not in reply.result
    assert tools["greet"]["execution"] == {"taskSupport": "forbidden"}
    assert tools["slow_compute"]["execution"] == {"taskSupport": "optional"}
    assert tools["maybe_slow"]["execution"] == {"taskSupport": "optional"}
    assert tools["failing_job"]["execution"] == {"taskSupport": "required"}
    assert_error(mcp.request("tools/list", {"cursor": "x"}), -32602)


def test_older_versions_see_no_task_support(client):
    session = DjangoLegacy(client)
    session.initialize("2025-06-18")
    tools = {t["name"]: t for t in session.request("tools/list").result["tools"]}
    assert "greet" in tools and "slow_compute" in tools
    assert "failing_job" not in tools, "a task-only tool cannot be called without tasks"
    assert all("execution" not in t for t in tools.values())
    # params.task is ignored: the call runs inline.
    reply = session.call_tool("slow_compute", {"seconds": 0, "label": "old"}, task={"ttl": 1000})
    assert reply.result["content"][0]["text"] == "computed old in 0.0s"
    assert_error(session.call_tool("failing_job"), -32601)
    assert_error(session.request("tasks/list"), -32601)
    assert not Task.objects.exists()


def test_a_plain_call_answers_inline_without_result_type(mcp):
    reply = mcp.call_tool("greet", {"name": "legacy"})
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.result == {"content": [{"type": "text", "text": "Hello, legacy!"}], "isError": False}
    error = mcp.call_tool("test_error_handling").result
    assert error["isError"] is True
    assert_error(mcp.call_tool("no_such_tool"), -32602)
    assert_error(mcp.call_tool("greet", {"nom": "x"}), -32602)


def test_task_mode_misuse_gets_the_spec_errors(mcp):
    assert_error(mcp.call_tool("greet", {"name": "x"}, task={"ttl": 1000}), -32601)
    assert_error(mcp.call_tool("failing_job"), -32601)
    assert_error(mcp.call_tool("slow_compute", {"seconds": 0}, task="soon"), -32602)
    assert_error(mcp.call_tool("slow_compute", {"seconds": 0}, task={"ttl": -1}), -32602)
    assert not Task.objects.exists()


def test_a_task_augmented_call_creates_a_legacy_task(mcp):
    reply = mcp.call_tool("slow_compute", {"seconds": 0, "label": "t"}, task={"ttl": 90_000})
    result = reply.result
    task = result["task"]
    assert set(task) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"}
    assert task["status"] == "working" and task["ttl"] == 90_000 and task["pollInterval"] > 0
    assert result["_meta"][RELATED] == {"taskId": task["taskId"]}
    assert task["taskId"] in result["_meta"][legacy.IMMEDIATE_RESPONSE]
    row = Task.objects.get(pk=task["taskId"])
    assert row.era == Era.LEGACY and row.owner == "anonymous" and row.ttl_ms == 90_000
    assert row.client_capabilities == CAPS
    assert LegacyTask.objects.get(task=row).session_id == mcp.session_id
    # Durable create: tasks/get works at once.
    assert mcp.request("tasks/get", {"taskId": row.id}).result["status"] == "working"


def test_the_ttl_is_capped_and_defaulted(mcp, settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_TTL_MS": 120_000, "DEFAULT_TTL_MS": 30_000}
    capped = mcp.create_task("slow_compute", {"seconds": 0}, ttl=10**9)
    assert Task.objects.get(pk=capped).ttl_ms == 120_000
    defaulted = mcp.create_task("slow_compute", {"seconds": 0}, ttl=None)
    assert mcp.request("tasks/get", {"taskId": defaulted}).result["ttl"] == 30_000


# Task methods ----------------------------------------------------------------------------------------------


def test_tasks_get_and_result_of_a_completed_task(mcp):
    task_id = mcp.create_task("slow_compute", {"seconds": 0, "label": "done"})
    assert run(task_id).status == TaskStatus.COMPLETED
    got = mcp.request("tasks/get", {"taskId": task_id}).result
    assert got["status"] == "completed" and got["taskId"] == task_id
    assert RELATED not in got.get("_meta", {}), "tasks/get does not repeat the task id in _meta"
    result = mcp.request("tasks/result", {"taskId": task_id})
    assert result.headers["Content-Type"].startswith("application/json")
    assert result.result["content"][0]["text"] == "computed done in 0.0s"
    assert result.result["isError"] is False
    assert result.result["_meta"][RELATED] == {"taskId": task_id}
    assert_error(mcp.request("tasks/get", {"taskId": "nope"}), -32602)
    assert_error(mcp.request("tasks/result", {"taskId": "nope"}), -32602)
    assert_error(mcp.request("tasks/get", {}), -32602)


def test_an_is_error_result_fails_the_task_and_is_still_the_result(mcp):
    task_id = mcp.create_task("failing_job")
    task = run(task_id)
    assert task.status == TaskStatus.FAILED and task.result["isError"] is True
    got = mcp.request("tasks/get", {"taskId": task_id}).result
    assert got["status"] == "failed"
    assert "simulated tool error" in got["statusMessage"]
    result = mcp.request("tasks/result", {"taskId": task_id}).result
    assert result["isError"] is True and result["_meta"][RELATED] == {"taskId": task_id}


def test_a_protocol_error_is_the_result_error(mcp):
    task_id = mcp.create_task("protocol_error_job")
    assert run(task_id).status == TaskStatus.FAILED
    error = assert_error(mcp.request("tasks/result", {"taskId": task_id}), -32603)
    assert error["message"] == "Simulated protocol error during execution"
    assert mcp.request("tasks/get", {"taskId": task_id}).result["statusMessage"]


def test_cancel_moves_to_cancelled_before_answering(mcp):
    task_id = mcp.create_task("slow_compute", {"seconds": 60})
    reply = mcp.request("tasks/cancel", {"taskId": task_id})
    assert reply.result["status"] == "cancelled" and reply.result["taskId"] == task_id
    assert reply.result["statusMessage"]
    assert Task.objects.get(pk=task_id).status == TaskStatus.CANCELLED
    error = assert_error(mcp.request("tasks/cancel", {"taskId": task_id}), -32602)
    assert "cancelled" in error["message"]
    assert_error(mcp.request("tasks/result", {"taskId": task_id}), -32603)
    done = mcp.create_task("slow_compute", {"seconds": 0})
    run(done)
    assert "completed" in assert_error(mcp.request("tasks/cancel", {"taskId": done}), -32602)["message"]
    assert_error(mcp.request("tasks/cancel", {"taskId": "nope"}), -32602)


def test_tasks_list_pages_with_an_opaque_cursor(mcp, monkeypatch):
    monkeypatch.setattr(legacy_tasks, "LIST_PAGE_SIZE", 2)
    created = [mcp.create_task("slow_compute", {"seconds": 0, "label": str(i)}) for i in range(5)]
    seen, cursors, cursor = [], [], None
    while True:
        reply = mcp.request("tasks/list", {"cursor": cursor} if cursor else {})
        seen += [t["taskId"] for t in reply.result["tasks"]]
        cursor = reply.result.get("nextCursor")
        if not cursor:
            break
        cursors.append(cursor)
    assert len(cursors) == 2, "three pages"
    assert seen == list(reversed(created)), "newest first, each once"
    for bad in ("garbage", 12, cursors[0][:-2], cursors[0] + "x"):
        assert_error(mcp.request("tasks/list", {"cursor": bad}), -32602)


def test_tasks_are_bound_to_the_identity(client):
    alice = user_session(client, "alice")
    bob = user_session(client, "bob")
    task_id = alice.create_task("slow_compute", {"seconds": 60})
    assert bob.request("tasks/list").result["tasks"] == []
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        assert_error(bob.request(method, {"taskId": task_id}), -32602)
    assert Task.objects.get(pk=task_id).status == TaskStatus.WORKING
    # Alice sees it from any of her sessions.
    again = user_session(client, "alice")
    assert [t["taskId"] for t in again.request("tasks/list").result["tasks"]] == [task_id]
    assert again.request("tasks/get", {"taskId": task_id}).status == 200


def test_anonymous_tasks_are_bound_to_their_session(client):
    first = DjangoLegacy(client)
    first.initialize()
    second = DjangoLegacy(client)
    second.initialize()
    task_id = first.create_task("slow_compute", {"seconds": 60})
    assert second.request("tasks/list").result["tasks"] == []
    assert_error(second.request("tasks/get", {"taskId": task_id}), -32602)
    assert first.request("tasks/get", {"taskId": task_id}).status == 200


def test_modern_tasks_are_not_legacy_tasks(mcp, rpc):
    modern_id = rpc.create_task("slow_compute", {"seconds": 60}, capabilities=FULL_CAPS)
    assert_error(mcp.request("tasks/get", {"taskId": modern_id}), -32602)
    assert mcp.request("tasks/list").result["tasks"] == []


def test_a_finished_task_past_its_ttl_is_gone(mcp):
    task_id = mcp.create_task("slow_compute", {"seconds": 0}, ttl=0)
    run(task_id)
    assert_error(mcp.request("tasks/get", {"taskId": task_id}), -32602)
    assert mcp.request("tasks/list").result["tasks"] == []


# The client's answers to a task's questions --------------------------------------------------------------


def waiting(mcp: DjangoLegacy, tool: str = "confirm_delete", arguments: dict | None = None) -> str:
    task_id = mcp.create_task(tool, {"filename": "a.txt"} if arguments is None else arguments)
    assert run(task_id).status == TaskStatus.INPUT_REQUIRED
    return task_id


def test_an_answer_lands_in_the_input_request_and_resumes_the_task(mcp):
    task_id = waiting(mcp)
    reply = mcp.respond(f"task:{task_id}:confirm", {"action": "accept", "content": {"confirm": True}})
    assert reply.status == 202 and not reply.raw
    row = InputRequest.objects.get(task_id=task_id, key="confirm")
    assert row.state == InputRequestState.ANSWERED and row.response["content"] == {"confirm": True}
    assert Task.objects.get(pk=task_id).status == TaskStatus.WORKING
    assert run(task_id).result["content"][0]["text"] == "Deleted a.txt"
    # A repeated answer is stale: accepted and ignored.
    assert mcp.respond(f"task:{task_id}:confirm", {"action": "decline"}).status == 202
    assert InputRequest.objects.get(task_id=task_id, key="confirm").response["action"] == "accept"


def test_answers_that_cannot_be_accepted(mcp, client):
    task_id = waiting(mcp)
    bad = mcp.respond(f"task:{task_id}:confirm", {"nonsense": True})
    assert bad.status == 400 and bad.error["code"] == -32602
    assert mcp.respond(f"task:{task_id}:other", {"action": "accept"}).status == 400
    assert mcp.respond("task:nope:confirm", {"action": "accept"}).status == 400
    # Someone else's session cannot answer for this task.
    other = DjangoLegacy(client)
    other.initialize()
    assert other.respond(f"task:{task_id}:confirm", {"action": "accept", "content": {"confirm": True}}).status == 400
    # Ids that are not ours, or answers for plain calls nobody waits for, are dropped.
    assert mcp.respond(42, {"whatever": 1}).status == 202
    assert mcp.respond("call:0123456789abcdef0123456789abcdef:k", {"action": "accept"}).status == 202
    assert InputRequest.objects.get(task_id=task_id).state == InputRequestState.PENDING
    # And without a session there is nobody to answer for.
    mcp.session_id, session_id = None, mcp.session_id
    assert mcp.respond(f"task:{task_id}:confirm", {"action": "accept"}).status == 404
    mcp.session_id = session_id


def test_an_error_answer_fails_the_task(mcp):
    task_id = waiting(mcp)
    reply = mcp.respond(f"task:{task_id}:confirm", error={"code": -1, "message": "User rejected"})
    assert reply.status == 202
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.FAILED
    assert task.error["code"] == -1 and "User rejected" in task.error["message"]
    assert "User rejected" in assert_error(mcp.request("tasks/result", {"taskId": task_id}), -1)["message"]


def test_partial_answers_keep_the_task_waiting(mcp):
    task_id = waiting(mcp, "multi_input", {})
    accept = {"action": "accept", "content": {"name": "one"}}
    assert mcp.respond(f"task:{task_id}:first", accept).status == 202
    assert Task.objects.get(pk=task_id).status == TaskStatus.INPUT_REQUIRED
    assert mcp.respond(f"task:{task_id}:second", {**accept, "content": {"name": "two"}}).status == 202
    assert run(task_id).result["content"][0]["text"] == "Got one and two."


# Prompts, resources, completion ---------------------------------------------------------------------------


def test_resources_prompts_and_completion_in_2025_form(mcp):
    listed = mcp.request("resources/list").result
    assert "ttlMs" not in listed and "resultType" not in listed and listed["resources"]
    read = mcp.request("resources/read", {"uri": "test://static-text"}).result
    assert read["contents"][0]["text"] and "cacheScope" not in read
    templates = mcp.request("resources/templates/list").result
    assert templates["resourceTemplates"][0]["uriTemplate"] == "test://template/{id}/data"
    missing = assert_error(mcp.request("resources/read", {"uri": "test://nope"}), -32002)
    assert missing["data"] == {"uri": "test://nope"}
    prompts = mcp.request("prompts/list").result
    assert "test_simple_prompt" in [p["name"] for p in prompts["prompts"]]
    got = mcp.request("prompts/get", {"name": "test_prompt_with_arguments", "arguments": {"arg1": "a", "arg2": "b"}})
    assert "resultType" not in got.result and "arg1='a'" in got.result["messages"][0]["content"]["text"]
    completion = mcp.request(
        "completion/complete",
        {
            "ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"},
            "argument": {"name": "arg1", "value": "te"},
        },
    ).result
    assert completion["completion"]["values"] == ["test", "testValue1"]


def test_resource_subscriptions_are_remembered(mcp):
    uri = "test://watched-resource"
    assert mcp.request("resources/subscribe", {"uri": uri}).result == {}
    assert mcp.request("resources/subscribe", {"uri": uri}).result == {}
    assert LegacySession.objects.get(pk=mcp.session_id).resource_subscriptions == [uri]
    assert mcp.request("resources/unsubscribe", {"uri": uri}).result == {}
    assert LegacySession.objects.get(pk=mcp.session_id).resource_subscriptions == []
    assert_error(mcp.request("resources/subscribe", {}), -32602)


# The eras do not leak ------------------------------------------------------------------------------------


def test_the_modern_wire_is_unchanged(rpc):
    discover = rpc.request("server/discover").result
    assert "tasks" not in discover["capabilities"]
    for method in ("tasks/list", "tasks/result", "initialize", "ping", "logging/setLevel", "resources/subscribe"):
        reply = rpc.request(method, {"taskId": "x"} if method == "tasks/result" else {})
        assert reply.status == 404 and reply.error["code"] == -32601, (method, reply)


def test_status_changes_of_legacy_tasks_are_forwarded_to_their_session(mcp, monkeypatch):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from mcptasks.notify import fabric as notify
    from mcptasks.notify import followers
    from mcptasks.protocol.legacy import sessions as legacy_sessions

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(notify.publisher, "publish", lambda group, payload: sent.append((group, payload)))
    group = legacy_sessions.session_group(mcp.session_id)
    # The session's GET stream follows its group (changes nobody follows are not sent).
    registry = followers.registry_of(get_channel_layer())
    assert registry is not None
    async_to_sync(registry.register)([group], "test-stream", 60)
    try:
        task_id = mcp.create_task("slow_compute", {"seconds": 0})
        lifecycle.cancel(task_id, actor="system")
    finally:
        async_to_sync(registry.unregister)([group], "test-stream")
    statuses = [p["notification"]["params"]["status"] for g, p in sent if g == group and "notification" in p]
    assert statuses == ["working", "cancelled"]
    for _, payload in sent:
        if "notification" in payload:
            assert payload["notification"]["method"] == "notifications/tasks/status"
            assert RELATED not in payload["notification"]["params"].get("_meta", {})


def test_a_throttled_legacy_request_says_when_to_come_back(mcp, settings):
    """429 with -31000 and ``Retry-After`` in whole seconds, as in the modern era."""
    settings.MCPTASKS = {**settings.MCPTASKS, "THROTTLE_RATES": {"call": "1/m"}}
    assert mcp.call_tool("greet", {"name": "a"}).status == 200
    refused = mcp.call_tool("greet", {"name": "b"})
    error = assert_error(refused, -31000, status=429)
    retry_after = refused.headers.get("Retry-After")
    assert retry_after is not None and 1 <= int(retry_after) <= 60, refused.headers
    assert 0 < error["data"]["retryAfterMs"] <= 60_000


# Input past what a store can keep (issue 26) -------------------------------------------------------------


def _with_huge_number(body: dict) -> bytes:
    """``body`` as JSON with ``"HUGE"`` written as ``1e400`` (past double range)."""
    return json.dumps(body).replace('"HUGE"', "1e400").encode()


def test_a_number_past_double_range_in_arguments_is_invalid_params_naming_it(mcp):
    for params in (
        {"name": "slow_compute", "arguments": {"seconds": "HUGE"}},
        {"name": "slow_compute", "arguments": {"seconds": "HUGE"}, "task": {"ttl": 60000}},
    ):
        body = {"jsonrpc": "2.0", "id": 81, "method": "tools/call", "params": params}
        reply = mcp.post(_with_huge_number(body))
        assert reply.status < 500 and reply.body["id"] == 81, reply
        assert reply.error["code"] == -32602
        assert "arguments.seconds" in reply.error["message"]
    assert not Task.objects.exists()


def test_a_number_past_double_range_in_an_answer_is_invalid_params(mcp):
    task_id = waiting(mcp)
    body = {
        "jsonrpc": "2.0",
        "id": f"task:{task_id}:confirm",
        "result": {"action": "accept", "content": {"confirm": True, "n": "HUGE"}},
    }
    reply = mcp.post(_with_huge_number(body))
    assert reply.status == 400 and reply.error["code"] == -32602, reply
    assert "double range" in reply.error["message"]
    assert InputRequest.objects.get(task_id=task_id).state == InputRequestState.PENDING
    assert Task.objects.get(pk=task_id).status == TaskStatus.INPUT_REQUIRED


@pytest.mark.parametrize("method", ["tasks/get", "tasks/result", "tasks/cancel"])
def test_a_task_id_with_a_lone_surrogate_is_not_found(mcp, method):
    for task_id in ("ab\ud800", "ab\x00", "a" * 65):
        reply = mcp.request(method, {"taskId": task_id})
        assert reply.status < 500 and reply.error["code"] == -32602, reply
        unknown = mcp.request(method, {"taskId": "abc"})
        assert reply.error == unknown.error
