"""End to end over HTTP: uvicorn + Celery worker (Redis) + Postgres.

The client validates every message against the pinned schemas.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support import postgres_only
from tests.support.rpc import NO_CAPS, TASKS_CAPS, HttpRpc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]


def accept(**content):
    return {"action": "accept", "content": content}


def text(result: dict) -> str:
    return " ".join(block.get("text", "") for block in result["content"])


def wait_running(stack, task_id: str, timeout: float = 15) -> dict:
    """Until a worker holds the task's lease (its run has started)."""

    def held() -> dict | None:
        row = stack.task_row(task_id)
        return row if row and row["lease_owner"] else None

    return wait_until(held, timeout, interval=0.02, what=f"a worker picking up {task_id}", explain=stack.logs)


def test_sync_tool_call(live):
    reply = live.call_tool("greet", {"name": "World"})
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert reply.result["content"] == [{"type": "text", "text": "Hello, World!"}]


def test_task_runs_to_completion(live):
    created = live.call_tool("slow_compute", {"seconds": 0.5, "label": "e2e"}).result
    assert created["resultType"] == "task"
    statuses = []
    final = live.wait_for(created["taskId"], on_poll=lambda r: statuses.append(r.result["status"]))
    assert final["status"] == "completed"
    assert final["result"]["isError"] is False
    assert "e2e" in text(final["result"])
    assert final["lastUpdatedAt"] >= final["createdAt"]
    assert set(statuses) <= {"working", "completed"}


def test_tasks_get_resolves_at_once_after_create(live):
    task_id = live.create_task("slow_compute", {"seconds": 60, "label": "consistency"})
    try:
        got = live.tasks_get(task_id)
        assert got.status == 200
        assert got.result["taskId"] == task_id
    finally:
        live.tasks_cancel(task_id)


def test_elicitation_round_trip(live):
    task_id = live.create_task("confirm_delete", {"filename": "e2e.txt"})
    waiting = live.wait_for(task_id, {"input_required"}, timeout=5)
    assert waiting["status"] == "input_required"
    requests = waiting["inputRequests"]
    assert list(requests) == ["confirm"]
    assert requests["confirm"]["method"] == "elicitation/create"
    assert requests["confirm"]["params"]["requestedSchema"]["type"] == "object"
    assert live.tasks_get(task_id).result["inputRequests"] == requests, "the snapshot repeats until answered"
    ack = live.tasks_update(task_id, {"confirm": accept(confirm=True)})
    assert ack.status == 200
    assert set(ack.result) <= {"resultType", "_meta"} and ack.result["resultType"] == "complete"
    final = live.wait_for(task_id)
    assert final["status"] == "completed"
    assert "e2e.txt" in text(final["result"])
    assert "inputRequests" not in final


def test_two_questions_answered_one_at_a_time(live):
    task_id = live.create_task("multi_input", {})
    waiting = live.wait_for(task_id, {"input_required"}, timeout=5)
    first, second = sorted(waiting["inputRequests"])
    live.tasks_update(task_id, {first: accept(name="Grace", confirm=True)})
    still = live.tasks_get(task_id).result
    assert still["status"] == "input_required"
    assert set(still["inputRequests"]) == {second}
    live.tasks_update(task_id, {second: accept(name="Hopper", confirm=True), first: accept(name="again")})
    final = live.wait_for(task_id)
    assert final["status"] == "completed"
    assert "Grace" in text(final["result"]) and "Hopper" in text(final["result"])


def test_cancel_of_a_long_task_is_seen_within_two_seconds(live, live_stack):
    task_id = live.create_task("slow_compute", {"seconds": 60, "label": "cancel-me"})
    wait_running(live_stack, task_id)
    started = time.monotonic()
    ack = live.tasks_cancel(task_id)
    assert ack.result == {k: v for k, v in ack.result.items() if k in ("resultType", "_meta")}
    final = live.wait_for(task_id, timeout=2, interval=0.02)
    elapsed = time.monotonic() - started
    print(f"\ncancel -> tasks/get reads {final['status']!r} after {elapsed * 1000:.0f} ms")
    assert final["status"] == "cancelled"
    assert elapsed < 2.0
    assert "result" not in final and "error" not in final
    again = live.tasks_cancel(task_id)
    assert again.result["resultType"] == "complete"


def test_cancel_frees_the_workers(live, live_stack):
    """Both pool processes run a 60 s task; after cancelling them a new task
    still runs at once (the runs really stopped)."""
    long_ids = [live.create_task("slow_compute", {"seconds": 60, "label": f"hog-{i}"}) for i in range(2)]
    try:
        for task_id in long_ids:
            wait_running(live_stack, task_id)
    finally:
        for task_id in long_ids:
            live.tasks_cancel(task_id)
    quick = live.create_task("slow_compute", {"seconds": 0, "label": "after"})
    started = time.monotonic()
    final = live.wait_for(quick, timeout=10)
    print(f"\nquick task after cancelling the hogs: {time.monotonic() - started:.2f}s")
    assert final["status"] == "completed"


def test_mrtr_then_task(live):
    first = live.call_tool("test_tool_with_task", {}).result
    assert first["resultType"] == "input_required"
    assert "taskId" not in first
    (key,) = first["inputRequests"]
    extra = {"inputResponses": {key: accept(name="Alice")}}
    if "requestState" in first:
        extra["requestState"] = first["requestState"]
    created = live.call_tool("test_tool_with_task", {}, extra=extra).result
    assert created["resultType"] == "task"
    assert "requestState" not in created and "inputRequests" not in created
    final = live.wait_for(created["taskId"])
    assert final["status"] == "completed"
    assert "Alice" in final["result"]["content"][0]["text"]


def test_tool_error_ends_completed_with_is_error(live):
    final = live.wait_for(live.create_task("failing_job", {}))
    assert final["status"] == "completed"
    assert final["result"]["isError"] is True
    assert "error" not in final


def test_protocol_error_ends_failed(live):
    final = live.wait_for(live.create_task("protocol_error_job", {}))
    assert final["status"] == "failed"
    assert isinstance(final["error"]["code"], int)
    assert isinstance(final["error"]["message"], str) and final["error"]["message"]
    assert "result" not in final


def test_required_task_tool_without_the_extension(live):
    reply = live.call_tool("failing_job", {}, capabilities=NO_CAPS)
    assert reply.status == 400
    assert reply.error["code"] == -32021
    assert reply.error["data"]["requiredCapabilities"] == {"extensions": {"io.modelcontextprotocol/tasks": {}}}


def test_optional_tool_is_inline_without_the_extension(live):
    reply = live.call_tool("slow_compute", {"seconds": 0, "label": "inline"}, capabilities=NO_CAPS)
    assert reply.result["resultType"] == "complete"
    assert "inline" in text(reply.result)


def test_auto_mode_tool(live):
    """``task="auto"``: a task when the run outlasts the budget; without the
    extension always inline."""
    slow = live.call_tool("maybe_slow", {"seconds": 3}).result
    assert slow["resultType"] == "task"
    assert live.wait_for(slow["taskId"], timeout=20)["status"] == "completed"
    quick = live.call_tool("maybe_slow", {"seconds": 0}).result
    if quick["resultType"] == "task":  # the worker was slower than the budget
        assert live.wait_for(quick["taskId"])["status"] == "completed"
    else:
        assert quick["resultType"] == "complete" and quick["content"]
    inline = live.call_tool("maybe_slow", {"seconds": 0}, capabilities=NO_CAPS).result
    assert inline["resultType"] == "complete" and "taskId" not in inline


def test_many_tasks_at_once(live):
    ids = [
        live.create_task("slow_compute", {"seconds": 0.2, "label": f"n{i}"}, capabilities=TASKS_CAPS) for i in range(12)
    ]
    assert len(set(ids)) == 12
    finals = [live.wait_for(task_id, timeout=30) for task_id in ids]
    assert [f["status"] for f in finals] == ["completed"] * 12
    for i, final in enumerate(finals):
        assert f"n{i}" in text(final["result"])


def test_concurrent_clients(live_stack):
    """Many clients at once, each creating a task and polling it to the end."""

    def one(i: int) -> tuple[str, dict]:
        client = HttpRpc(live_stack.url)
        try:
            task_id = client.create_task("slow_compute", {"seconds": 0.1, "label": f"c{i}"})
            return task_id, client.wait_for(task_id, timeout=60, interval=0.1)
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, range(32)))
    assert len({task_id for task_id, _ in results}) == 32
    for i, (task_id, final) in enumerate(results):
        assert final["taskId"] == task_id
        assert final["status"] == "completed", final
        assert f"c{i}" in text(final["result"])


def test_progress_notifications_stream_before_the_result(live):
    reply = live.call_tool("test_tool_with_progress", {}, meta_extra={"progressToken": "progress-e2e"})
    assert reply.status == 200
    assert reply.headers.get("content-type", "").startswith("text/event-stream")
    progress = [e for e in reply.events if e.get("method") == "notifications/progress"]
    assert len(progress) >= 3
    assert all(e["params"]["progressToken"] == "progress-e2e" for e in progress)
    values = [e["params"]["progress"] for e in progress]
    assert values == sorted(values)
    assert reply.result["resultType"] == "complete"


def test_server_survives_a_bad_request_storm(live_stack):
    client = HttpRpc(live_stack.url)
    try:
        for payload in (b"{", b"[]", b'{"jsonrpc":"2.0"}', b"null"):
            reply = client.post_raw(payload, {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "x"})
            assert 400 <= reply.status < 500
        assert client.call_tool("greet", {"name": "still here"}).result["content"][0]["text"] == "Hello, still here!"
    finally:
        client.close()
