"""The 2026-07-28 wire at /mcp, through Django's test client.

Every reply is validated against the pinned schemas by the client
(tests/support/rpc.py), so each test here also checks the message shapes.

The endpoint does its database work on its own pool of threads (their own
connections), so these tests commit their rows (``transaction=True``).
"""

from __future__ import annotations

import base64
import json
import re

import pytest

from mcptasks.models import InputRequest, InputRequestState, Task, TaskStatus
from mcptasks.tasks import lifecycle
from tests.support.factories import WORKER, accept, completed_task, failed_task, running_task, waiting_task
from tests.support.rpc import FULL_CAPS, NO_CAPS, PROTOCOL_VERSION, TASKS_CAPS, TASKS_EXT, build_meta
from tests.support.schemas import assert_create_task_result, assert_detailed_task, assert_valid_message

pytestmark = pytest.mark.django_db(transaction=True)

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
ACK_KEYS = {"resultType", "_meta"}
ANON = "anonymous"


def assert_error(reply, code: int, status: int) -> dict:
    assert reply.status == status, reply
    error = reply.error
    assert error["code"] == code, reply
    assert isinstance(error["message"], str) and error["message"]
    return error


def assert_ack(reply) -> None:
    assert reply.status == 200, reply
    assert reply.result["resultType"] == "complete"
    assert set(reply.result) <= ACK_KEYS, f"an ack carries nothing else: {reply.result}"


# Discovery and listing ----------------------------------------------------------------------


@pytest.mark.parametrize("caps", [FULL_CAPS, NO_CAPS])
def test_discover(rpc, caps):
    reply = rpc.request("server/discover", capabilities=caps)
    assert reply.status == 200
    result = reply.result
    assert result["resultType"] == "complete"
    assert PROTOCOL_VERSION in result["supportedVersions"]
    assert result["capabilities"]["extensions"][TASKS_EXT] == {}
    assert "tasks" not in result["capabilities"], "2025-11-25 capabilities.tasks must not be advertised"
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0
    assert result["cacheScope"] in ("public", "private")
    info = result["_meta"]["io.modelcontextprotocol/serverInfo"]
    assert info["name"] and info["version"]


def test_client_info_is_optional(rpc):
    reply = rpc.request("server/discover", meta=build_meta(NO_CAPS, client_info=False))
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"


def test_tools_list(rpc):
    first = rpc.request("tools/list")
    assert first.status == 200
    result = first.result
    assert result["resultType"] == "complete"
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0
    assert result["cacheScope"] in ("public", "private")
    names = [t["name"] for t in result["tools"]]
    assert len(names) == len(set(names))
    for required in (
        "greet",
        "slow_compute",
        "failing_job",
        "protocol_error_job",
        "confirm_delete",
        "multi_input",
        "test_tool_with_task",
    ):
        assert required in names
    assert all(t["description"] for t in result["tools"])
    again = rpc.request("tools/list")
    assert [t["name"] for t in again.result["tools"]] == names, "the order must be stable"


# Envelope errors ------------------------------------------------------------------------------


MODERN_HEADERS = {"MCP-Protocol-Version": PROTOCOL_VERSION, "Mcp-Method": "tools/list"}


def test_parse_error(rpc):
    reply = rpc.post_raw(b'{"jsonrpc": "2.0", "id": 1, "method": ', MODERN_HEADERS)
    error = assert_error(reply, -32700, 400)
    assert reply.body.get("id") is None
    assert_valid_message("", reply.body)
    assert error


@pytest.mark.parametrize(
    "payload",
    [
        [],
        [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}],
        "just a string",
        {"id": 1, "method": "tools/list"},
        {"jsonrpc": "1.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "method": ""},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1, 2]},
        {"jsonrpc": "2.0", "id": True, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
    ],
    ids=[
        "empty-batch",
        "batch",
        "string",
        "no-jsonrpc",
        "jsonrpc-1.0",
        "no-method",
        "empty-method",
        "method-not-string",
        "params-array",
        "id-bool",
        "id-object",
        "a-response",
    ],
)
def test_invalid_request(rpc, payload):
    reply = rpc.post_raw(json.dumps(payload).encode(), MODERN_HEADERS)
    assert_error(reply, -32600, 400)
    assert_valid_message("", reply.body)


@pytest.mark.parametrize("era_headers", [MODERN_HEADERS, {}], ids=["modern", "no-version-header"])
@pytest.mark.parametrize("bad_id", [True, False, 1.5, {"a": 1}, [1]], ids=["true", "false", "float", "object", "array"])
def test_an_invalid_id_is_never_echoed(rpc, era_headers, bad_id):
    """JSON-RPC: when the id cannot be used, the error's id is null. Echoing
    ``true`` produces an invalid response (RequestId is a string or integer)."""
    payload = {"jsonrpc": "2.0", "id": bad_id, "method": "initialize", "params": {}}
    reply = rpc.post_raw(json.dumps(payload).encode(), era_headers)
    assert reply.status == 400
    assert reply.error["code"] == -32600
    assert reply.body.get("id") is None, f"echoed an invalid id: {reply.body}"


# _meta, version and header validation ------------------------------------------------------------


@pytest.mark.parametrize(
    "meta",
    [
        None,
        {},
        build_meta(NO_CAPS, version=None),
        build_meta(None),
        {**build_meta(NO_CAPS), "io.modelcontextprotocol/clientCapabilities": "all of them"},
        {**build_meta(NO_CAPS), "io.modelcontextprotocol/protocolVersion": 20260728},
    ],
    ids=["no-meta", "empty-meta", "no-version", "no-capabilities", "capabilities-not-object", "version-not-string"],
)
def test_missing_or_malformed_meta_is_invalid_params_400(rpc, meta):
    reply = rpc.request("server/discover", meta=meta)
    assert_error(reply, -32602, 400)


@pytest.mark.parametrize("level", ["verbose-nonsense", "DEBUG", 3, None])
def test_unknown_log_level_is_invalid_params_naming_the_field(rpc, level):
    reply = rpc.call_tool("greet", {"name": "World"}, meta_extra={"io.modelcontextprotocol/logLevel": level})
    error = assert_error(reply, -32602, 400)
    assert "io.modelcontextprotocol/logLevel" in error["message"]


@pytest.mark.parametrize("level", ["debug", "emergency"])
def test_known_log_level_is_accepted(rpc, level):
    reply = rpc.request("tools/list", meta_extra={"io.modelcontextprotocol/logLevel": level})
    assert reply.status == 200, reply
    assert any(tool["name"] == "greet" for tool in reply.result["tools"])


def test_missing_protocol_version_header(rpc):
    reply = rpc.request("tools/list", headers={"MCP-Protocol-Version": None})
    assert_error(reply, -32020, 400)


def test_protocol_version_header_must_match_meta(rpc):
    reply = rpc.request("tools/list", headers={"MCP-Protocol-Version": "2099-01-01"})
    assert_error(reply, -32020, 400)


def test_header_mismatch_is_checked_before_version_support(rpc):
    meta = build_meta(NO_CAPS, version="v999.0.0")
    reply = rpc.request("server/discover", meta=meta, headers={"MCP-Protocol-Version": PROTOCOL_VERSION})
    assert_error(reply, -32020, 400)


def test_unsupported_version(rpc):
    reply = rpc.request("server/discover", version="v999.0.0", capabilities=NO_CAPS, request_id="v-1")
    error = assert_error(reply, -32022, 400)
    assert reply.body["id"] == "v-1"
    assert error["data"]["requested"] == "v999.0.0"
    assert PROTOCOL_VERSION in error["data"]["supported"]


def test_mcp_method_header_required_and_must_match(rpc):
    assert_error(rpc.request("tools/list", headers={"Mcp-Method": None}), -32020, 400)
    assert_error(rpc.request("tools/list", headers={"Mcp-Method": "tools/call"}), -32020, 400)
    assert_error(rpc.request("tools/list", headers={"Mcp-Method": "Tools/List"}), -32020, 400)


def test_mcp_name_required_on_tools_call_and_must_match(rpc):
    no_name = rpc.call_tool("greet", {"name": "x"}, headers={"Mcp-Name": None})
    assert_error(no_name, -32020, 400)
    wrong = rpc.call_tool("greet", {"name": "x"}, headers={"Mcp-Name": "slow_compute"})
    assert_error(wrong, -32020, 400)


def test_mcp_name_may_be_base64_encoded(rpc):
    encoded = "=?base64?" + base64.b64encode(b"greet").decode() + "?="
    reply = rpc.call_tool("greet", {"name": "b64"}, headers={"Mcp-Name": encoded})
    assert reply.status == 200
    assert reply.result["content"][0]["text"] == "Hello, b64!"


def test_mcp_name_on_tasks_methods_may_be_omitted_but_not_wrong(poll_rpc):
    task = running_task(owner=ANON)
    omitted = poll_rpc.tasks_get(task.id, headers={"Mcp-Name": None})
    assert omitted.status == 200
    assert omitted.result["taskId"] == task.id
    for method in ("tasks/get", "tasks/cancel"):
        wrong = poll_rpc.request(method, {"taskId": task.id}, headers={"Mcp-Name": "some-other-task"})
        assert_error(wrong, -32020, 400)
    wrong = poll_rpc.tasks_update(task.id, {}, headers={"Mcp-Name": "some-other-task"})
    assert_error(wrong, -32020, 400)
    assert Task.objects.get(pk=task.id).status == TaskStatus.WORKING, "a rejected cancel must not cancel"


def test_errors_echo_the_request_id(rpc):
    for request_id in (7, "req-7"):
        reply = rpc.request("no/such/method", request_id=request_id)
        assert reply.body["id"] == request_id


# Methods -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["unknown/method", "tasks/result", "tasks/list", "initialize", "ping", "logging/setLevel"]
)
def test_unknown_and_removed_methods_are_404(rpc, method):
    params = {"taskId": "whatever"} if method == "tasks/result" else {}
    reply = rpc.request(method, params)
    assert_error(reply, -32601, 404)


@pytest.mark.parametrize("http_method", ["GET", "DELETE"])
def test_get_and_delete_are_405(rpc, http_method):
    reply = rpc.send(http_method, {"Accept": "text/event-stream", "MCP-Protocol-Version": PROTOCOL_VERSION})
    assert reply.status == 405
    assert "POST" in reply.headers.get("Allow", "")


def test_notification_is_accepted_with_202(rpc):
    reply = rpc.request(
        "notifications/cancelled", {"requestId": 1, "reason": "test"}, notification=True, capabilities=NO_CAPS
    )
    assert reply.status == 202
    assert reply.raw == b""


def test_foreign_host_is_refused(rpc):
    reply = rpc.request("server/discover", headers={"Host": "evil.example.com"})
    assert 400 <= reply.status < 500
    assert "result" not in (reply.body or {})


def test_foreign_origin_is_forbidden(rpc):
    reply = rpc.request("server/discover", headers={"Origin": "http://evil.example.com"})
    assert reply.status == 403
    ok = rpc.request("server/discover", headers={"Origin": "http://localhost:8000"})
    assert ok.status == 200


# tools/call ------------------------------------------------------------------------------------------


def test_sync_tool(rpc):
    reply = rpc.call_tool("greet", {"name": "World"})
    assert reply.status == 200
    result = reply.result
    assert result["resultType"] == "complete"
    assert "taskId" not in result
    assert result["content"] == [{"type": "text", "text": "Hello, World!"}]
    assert not Task.objects.exists()


def test_create_task_result_is_flat_and_durable(rpc):
    reply = rpc.call_tool("slow_compute", {"seconds": 30, "label": "flat"}, capabilities=TASKS_CAPS)
    assert reply.status == 200
    result = reply.result
    assert_create_task_result(result)
    assert result["resultType"] == "task"
    assert result["status"] == "working"
    for gone in ("task", "result", "error", "inputRequests", "requestState", "ttl", "pollInterval"):
        assert gone not in result, gone
    assert ISO.match(result["createdAt"]) and ISO.match(result["lastUpdatedAt"])
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] > 0
    assert isinstance(result["pollIntervalMs"], int) and result["pollIntervalMs"] > 0
    # Durable: the row exists the moment the handle is returned.
    task = Task.objects.get(pk=result["taskId"])
    assert (task.owner, task.tool_name, task.arguments) == (ANON, "slow_compute", {"seconds": 30, "label": "flat"})
    got = rpc.tasks_get(result["taskId"], capabilities=TASKS_CAPS)
    assert got.result["taskId"] == result["taskId"]
    assert got.result["status"] == "working"


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_tasks_get_states_the_times_the_task_was_created_with(poll_rpc, settings, zone):
    """Whatever the site's TIME_ZONE (the process's local time follows it),
    ``tasks/get`` reports the instants the creation reported."""
    settings.TIME_ZONE = zone
    created = poll_rpc.call_tool("slow_compute", {"seconds": 30, "label": "zone"}, capabilities=TASKS_CAPS).result
    got = poll_rpc.tasks_get(created["taskId"], capabilities=TASKS_CAPS).result
    assert (got["createdAt"], got["lastUpdatedAt"]) == (created["createdAt"], created["lastUpdatedAt"])


def test_optional_task_tool_runs_inline_without_the_extension(rpc):
    reply = rpc.call_tool("slow_compute", {"seconds": 0, "label": "sync"}, capabilities=NO_CAPS)
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert "taskId" not in reply.result
    assert reply.result["content"]
    assert not Task.objects.exists()


def test_capabilities_are_per_request(rpc):
    task_id = rpc.create_task("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS)
    reply = rpc.tasks_get(task_id, capabilities=NO_CAPS)
    assert_error(reply, -32021, 400)


def test_required_task_tool_without_the_extension_is_32021(rpc):
    reply = rpc.call_tool("failing_job", {}, capabilities=NO_CAPS)
    error = assert_error(reply, -32021, 400)
    assert error["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXT: {}}}
    assert not Task.objects.exists()


def test_undeclared_sampling_capability_is_32021(rpc):
    reply = rpc.call_tool("test_missing_capability", {}, capabilities=NO_CAPS)
    error = assert_error(reply, -32021, 400)
    assert error["data"]["requiredCapabilities"] == {"sampling": {}}


def test_legacy_task_param_is_ignored(rpc):
    legacy = {"task": {"ttl": 60000, "pollInterval": 100}}
    reply = rpc.call_tool("greet", {"name": "legacy-hint"}, extra=legacy)
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert reply.result["content"][0]["text"] == "Hello, legacy-hint!"
    inline = rpc.call_tool("slow_compute", {"seconds": 0}, extra=legacy, capabilities=NO_CAPS)
    assert inline.result["resultType"] == "complete"
    assert not Task.objects.exists(), "params.task must not create a task"


def test_unknown_tool_and_bad_arguments_are_invalid_params(rpc):
    unknown = rpc.call_tool("no_such_tool", {})
    assert unknown.error["code"] == -32602
    bad = rpc.call_tool("greet", {"name": 5, "extra": True})
    assert bad.error["code"] == -32602
    missing = rpc.call_tool("greet", {})
    assert missing.error["code"] == -32602
    assert "name" in missing.error["message"]


def test_task_tool_arguments_are_validated_before_a_task_exists(rpc):
    reply = rpc.call_tool("slow_compute", {"seconds": "a while"}, capabilities=TASKS_CAPS)
    assert reply.error["code"] == -32602
    assert not Task.objects.exists()


def b64(value: str) -> str:
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


@pytest.mark.parametrize(
    ("region", "header"),
    [("us-west1", "us-west1"), ("Zürich", b64("Zürich")), (" padded ", b64(" padded "))],
    ids=["plain", "non-ascii", "padded"],
)
def test_x_mcp_header_parameter_mirrored(rpc, region, header):
    reply = rpc.call_tool("regional_query", {"region": region, "query": "q"}, headers={"Mcp-Param-Region": header})
    assert reply.status == 200, reply
    assert region in reply.result["content"][0]["text"]


@pytest.mark.parametrize("header", [None, "eu-north1", b64("eu-north1"), "=?base64?not base64?="])
def test_x_mcp_header_parameter_missing_or_wrong_is_32020(rpc, header):
    reply = rpc.call_tool("regional_query", {"region": "us-west1", "query": "q"}, headers={"Mcp-Param-Region": header})
    assert_error(reply, -32020, 400)


# MRTR before a task --------------------------------------------------------------------------------------


def mrtr_first_round(rpc, caps=FULL_CAPS):
    reply = rpc.call_tool("test_tool_with_task", {}, capabilities=caps)
    assert reply.status == 200, reply
    result = reply.result
    assert result["resultType"] == "input_required"
    assert "taskId" not in result
    (key,) = result["inputRequests"]
    assert result["inputRequests"][key]["method"] == "elicitation/create"
    return key, result


def test_mrtr_then_task(rpc):
    key, first = mrtr_first_round(rpc)
    assert isinstance(first.get("requestState"), str) and first["requestState"]
    assert not Task.objects.exists(), "no task before the input arrived"
    answer = accept(name="Alice")
    second = rpc.call_tool(
        "test_tool_with_task", {}, extra={"inputResponses": {key: answer}, "requestState": first["requestState"]}
    )
    result = second.result
    assert_create_task_result(result)
    assert "requestState" not in result and "inputRequests" not in result
    row = InputRequest.objects.get(task_id=result["taskId"], key=key)
    assert (row.state, row.response) == (InputRequestState.ANSWERED, answer)


def test_mrtr_without_request_state_still_works(rpc):
    key, _ = mrtr_first_round(rpc)
    second = rpc.call_tool("test_tool_with_task", {}, extra={"inputResponses": {key: accept(name="Bo")}})
    assert second.result["resultType"] == "task"


def test_tampered_request_state_is_rejected(rpc):
    key, first = mrtr_first_round(rpc)
    reply = rpc.call_tool(
        "test_tool_with_task",
        {},
        extra={"inputResponses": {key: accept(name="X")}, "requestState": first["requestState"] + "-TAMPERED"},
    )
    assert reply.error["code"] == -32602
    assert not Task.objects.exists()


def test_request_state_is_bound_to_its_call(rpc):
    _, first = mrtr_first_round(rpc)
    reply = rpc.call_tool("greet", {"name": "x"}, extra={"requestState": first["requestState"]})
    assert reply.error["code"] == -32602


def test_mrtr_without_elicitation_capability_is_32021(rpc):
    reply = rpc.call_tool("test_tool_with_task", {}, capabilities=TASKS_CAPS)
    error = assert_error(reply, -32021, 400)
    assert "elicitation" in error["data"]["requiredCapabilities"]


def test_mrtr_tool_requires_the_extension(rpc):
    reply = rpc.call_tool("test_tool_with_task", {}, capabilities={"elicitation": {}})
    assert_error(reply, -32021, 400)


# tasks/* ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_capability_is_checked_before_the_task_id(poll_rpc, method):
    params = {"taskId": "gate-test"}
    if method == "tasks/update":
        params["inputResponses"] = {}
    error = assert_error(poll_rpc.request(method, params, capabilities=NO_CAPS), -32021, 400)
    assert error["data"]["requiredCapabilities"]["extensions"][TASKS_EXT] == {}
    real = running_task(owner=ANON)
    params["taskId"] = real.id
    assert_error(poll_rpc.request(method, params, capabilities=NO_CAPS), -32021, 400)
    assert Task.objects.get(pk=real.id).status == TaskStatus.WORKING


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_unknown_task_is_invalid_params(poll_rpc, method):
    params = {"taskId": "tasks-conformance-nonexistent-12345", "inputResponses": {}}
    reply = poll_rpc.request(method, params)
    assert reply.error["code"] == -32602
    assert "not found" in reply.error["message"].lower()


def test_tasks_get_needs_a_task_id(poll_rpc):
    assert poll_rpc.request("tasks/get", {}).error["code"] == -32602
    assert poll_rpc.request("tasks/get", {"taskId": 12}, headers={"Mcp-Name": None}).error["code"] == -32602


def test_someone_elses_task_looks_unknown(poll_rpc):
    theirs = running_task(owner="user:999")
    mine = poll_rpc.tasks_get(theirs.id)
    unknown = poll_rpc.tasks_get("x" * len(theirs.id))
    strip = {k: v for k, v in mine.body.items() if k != "id"}
    assert strip == {k: v for k, v in unknown.body.items() if k != "id"}
    assert mine.status == unknown.status
    cancel = poll_rpc.tasks_cancel(theirs.id)
    assert cancel.error["code"] == -32602
    assert Task.objects.get(pk=theirs.id).status == TaskStatus.WORKING


def test_a_pruned_task_is_not_found(poll_rpc):
    from datetime import timedelta

    from django.utils import timezone

    done = completed_task(owner=ANON)
    assert poll_rpc.tasks_get(done.id).result["status"] == "completed"
    Task.objects.filter(pk=done.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.prune_expired() == 1
    gone = poll_rpc.tasks_get(done.id)
    unknown = poll_rpc.tasks_get("y" * len(done.id))
    assert gone.error["code"] == -32602
    assert (gone.status, gone.error) == (unknown.status, unknown.error)


def test_detailed_task_for_each_status(poll_rpc):
    working = running_task(owner=ANON)
    waiting = waiting_task(owner=ANON, keys=["pick"])
    done = completed_task(owner=ANON)
    failed = failed_task(owner=ANON)
    cancelled = running_task(owner=ANON)
    lifecycle.cancel(cancelled.id, actor="client:anonymous")
    seen = {}
    for task in (working, waiting, done, failed, cancelled):
        result = poll_rpc.tasks_get(task.id).result
        assert_detailed_task(result)
        assert result["resultType"] == "complete"
        assert result["taskId"] == task.id
        assert "requestState" not in result
        assert ISO.match(result["createdAt"]) and ISO.match(result["lastUpdatedAt"])
        seen[result["status"]] = result
    assert set(seen) == {"working", "input_required", "completed", "failed", "cancelled"}
    assert not {"result", "error", "inputRequests"} & set(seen["working"])
    assert set(seen["input_required"]["inputRequests"]) == {"pick"}
    assert seen["input_required"]["inputRequests"]["pick"]["method"] == "elicitation/create"
    assert "result" in seen["completed"] and "error" not in seen["completed"]
    assert "error" in seen["failed"] and "result" not in seen["failed"]
    assert seen["failed"]["error"] == {"code": -32603, "message": "boom"}
    assert not {"result", "error", "inputRequests"} & set(seen["cancelled"])
    assert "io.modelcontextprotocol/related-task" not in (seen["completed"]["result"].get("_meta") or {})


def test_tasks_get_twice_repeats_the_pending_requests(rpc):
    waiting = waiting_task(owner=ANON, keys=["a", "b"])
    first = rpc.tasks_get(waiting.id).result["inputRequests"]
    second = rpc.tasks_get(waiting.id).result["inputRequests"]
    assert first == second
    assert set(first) == {"a", "b"}


def test_tasks_update_partial_then_complete(rpc, published):
    waiting = waiting_task(owner=ANON, keys=["a", "b"])
    assert_ack(rpc.tasks_update(waiting.id, {"a": accept(v=1)}))
    result = rpc.tasks_get(waiting.id).result
    assert result["status"] == "input_required"
    assert set(result["inputRequests"]) == {"b"}
    assert_ack(rpc.tasks_update(waiting.id, {"b": accept(v=2), "unknown-key": {"ignored": True}}))
    assert rpc.tasks_get(waiting.id).result["status"] == "working"
    assert [m["args"] for m in published if m["task"] == "mcptasks.run_task"] == [[waiting.id]]


def test_tasks_update_ignores_unknown_keys(rpc):
    waiting = waiting_task(owner=ANON, keys=["a"])
    assert_ack(rpc.tasks_update(waiting.id, {"unknown-key": {"ignored": True}}))
    assert rpc.tasks_get(waiting.id).result["status"] == "input_required"


def test_tasks_update_needs_input_responses_object(rpc):
    waiting = waiting_task(owner=ANON, keys=["a"])
    reply = rpc.request("tasks/update", {"taskId": waiting.id})
    assert reply.error["code"] == -32602
    reply = rpc.tasks_update(waiting.id, ["a"])
    assert reply.error["code"] == -32602


def test_tasks_update_on_a_terminal_task_is_acked_and_changes_nothing(rpc):
    done = completed_task(owner=ANON)
    assert_ack(rpc.tasks_update(done.id, {"anything": accept()}))
    assert Task.objects.get(pk=done.id).status == TaskStatus.COMPLETED


def test_tasks_cancel_an_active_task(rpc):
    task = running_task(owner=ANON)
    assert_ack(rpc.tasks_cancel(task.id))
    assert rpc.tasks_get(task.id).result["status"] == "cancelled"
    waiting = waiting_task(owner=ANON)
    assert_ack(rpc.tasks_cancel(waiting.id))
    assert rpc.tasks_get(waiting.id).result["status"] == "cancelled"


@pytest.mark.parametrize("make", [completed_task, failed_task], ids=["completed", "failed"])
def test_tasks_cancel_of_a_terminal_task_is_still_an_ack(rpc, make):
    task = make(owner=ANON)
    before = Task.objects.get(pk=task.id)
    assert_ack(rpc.tasks_cancel(task.id))
    assert_ack(rpc.tasks_cancel(task.id))
    after = Task.objects.get(pk=task.id)
    assert (after.status, after.result, after.error) == (before.status, before.result, before.error)


def test_cancelled_run_cannot_complete_afterwards(rpc):
    task = running_task(owner=ANON)
    assert_ack(rpc.tasks_cancel(task.id))
    assert not lifecycle.complete(task.id, {"content": []}, worker=WORKER)
    assert rpc.tasks_get(task.id).result["status"] == "cancelled"


# Identity ---------------------------------------------------------------------------------------------------


def test_bearer_token_identifies_the_owner(poll_rpc, token_for, django_user_model):
    token = token_for("alice")
    task_id = poll_rpc.create_task("slow_compute", {"seconds": 30}, token=token)
    user = django_user_model.objects.get(username="alice")
    assert Task.objects.get(pk=task_id).owner == f"user:{user.pk}"
    assert poll_rpc.tasks_get(task_id, token=token).result["taskId"] == task_id
    assert poll_rpc.tasks_get(task_id).error["code"] == -32602, "the anonymous caller is someone else"
    other = token_for("bob")
    assert poll_rpc.tasks_get(task_id, token=other).error["code"] == -32602


def test_a_wrong_token_is_refused_even_when_anonymous_is_allowed(rpc):
    reply = rpc.request("server/discover", token="not-a-real-token")
    assert reply.status == 401
    assert reply.headers.get("WWW-Authenticate")


# Input past what a store can keep (issue 26) -------------------------------------------------------------


def _with_huge_number(body: dict) -> bytes:
    """``body`` as JSON with ``"HUGE"`` written as ``1e400``: valid JSON,
    past double range (Python reads it as infinity)."""
    return json.dumps(body).replace('"HUGE"', "1e400").encode()


def test_a_number_past_double_range_in_arguments_is_invalid_params_naming_it(poll_rpc):
    body = {
        "jsonrpc": "2.0",
        "id": 71,
        "method": "tools/call",
        "params": {
            "name": "slow_compute",
            "arguments": {"seconds": "HUGE"},
            "_meta": build_meta(TASKS_CAPS),
        },
    }
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Method": "tools/call", "Mcp-Name": "slow_compute"}
    headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
    reply = poll_rpc.post_raw(_with_huge_number(body), headers)
    error = assert_error(reply, -32602, reply.status)
    assert reply.status < 500 and reply.body["id"] == 71
    assert "arguments.seconds" in error["message"] and "double range" in error["message"]
    assert not Task.objects.exists()


def test_a_number_past_double_range_in_answers_is_invalid_params_naming_it(poll_rpc):
    task = waiting_task(owner=ANON, keys=["first"])
    body = {
        "jsonrpc": "2.0",
        "id": 72,
        "method": "tasks/update",
        "params": {
            "taskId": task.id,
            "inputResponses": {"first": {"action": "accept", "content": {"n": "HUGE"}}},
            "_meta": build_meta(TASKS_CAPS),
        },
    }
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Method": "tasks/update", "Mcp-Name": task.id}
    headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
    reply = poll_rpc.post_raw(_with_huge_number(body), headers)
    error = assert_error(reply, -32602, reply.status)
    assert reply.status < 500 and reply.body["id"] == 72
    assert "inputResponses.first.content.n" in error["message"]
    assert set(InputRequest.objects.filter(task=task).values_list("state", flat=True)) == {"pending"}
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_a_task_id_with_a_lone_surrogate_is_not_found(poll_rpc, method):
    params: dict = {"taskId": "ab\ud800"}
    if method == "tasks/update":
        params["inputResponses"] = {}
    reply = poll_rpc.request(method, params, headers={"Mcp-Name": None})
    assert_error(reply, -32602, reply.status)
    unknown = poll_rpc.request(method, {**params, "taskId": "abc"}, headers={"Mcp-Name": None})
    assert (reply.status, reply.error) == (unknown.status, unknown.error)
