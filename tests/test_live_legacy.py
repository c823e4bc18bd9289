"""The streams of the 2025-era wire on the live stack, over raw HTTP.

A second web process serves the same database and Redis, so that a client's
answer can land on a different process than the stream waiting for it (as
behind any load balancer): it must still get there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import live, postgres_only
from tests.support.legacy import RELATED, HttpLegacy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]


@pytest.fixture(scope="module")
def second_web(live_stack: Any) -> Iterator[str]:
    """Another uvicorn on the same services; its URL."""
    port = live.free_port()
    proc = live_stack.start("web-legacy-2", live.uvicorn_argv(port))
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        live.wait_http(url, proc, live_stack.log_dir / "web-legacy-2.log")
        yield url
    finally:
        live.kill_group(proc)
        live_stack.procs.pop("web-legacy-2", None)


@pytest.fixture
def mcp(live_stack: Any) -> Iterator[HttpLegacy]:
    client = HttpLegacy(live_stack.url)
    client.initialize()
    try:
        yield client
    finally:
        client.close()


def on(client: HttpLegacy, url: str) -> HttpLegacy:
    """The same session, talking to another web process."""
    other = HttpLegacy(url, token=client.token, version=client.version)
    other.session_id = client.session_id
    return other


def call(name: str, arguments: dict[str, Any], request_id: int, **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, **params},
    }


def test_a_plain_call_elicits_and_the_answer_may_reach_another_process(mcp, second_web):
    elsewhere = on(mcp, second_web)
    with mcp.stream(call("test_elicitation", {"message": "Who?"}, 7001)) as stream:
        assert stream.status == 200 and stream.content_type.startswith("text/event-stream")
        request = stream.next()
        assert request["method"] == "elicitation/create"
        assert request["params"]["requestedSchema"]["required"] == ["username", "email"]
        answer = {"action": "accept", "content": {"username": "u", "email": "e@example.com"}}
        assert elsewhere.respond(request["id"], answer).status == 202
        final = stream.next()
    assert final["id"] == 7001
    assert final["result"]["content"][0]["text"] == (
        'User response: action=accept, content={"username": "u", "email": "e@example.com"}'
    )
    assert "resultType" not in final["result"]


def test_a_plain_call_samples_and_an_error_answer_ends_it(mcp):
    with mcp.stream(call("test_sampling", {"prompt": "Hi"}, 7002)) as stream:
        request = stream.next()
        assert request["method"] == "sampling/createMessage"
        assert request["params"]["messages"][0]["content"]["text"] == "Hi"
        assert mcp.respond(request["id"], error={"code": -1, "message": "User rejected sampling"}).status == 202
        final = stream.next()
    assert final["id"] == 7002 and final["error"]["code"] == -1
    assert "User rejected sampling" in final["error"]["message"]


def test_progress_is_streamed_before_the_result(mcp):
    body = call("test_tool_with_progress", {}, 7003, _meta={"progressToken": "p-1"})
    with mcp.stream(body) as stream:
        messages = [stream.next() for _ in range(4)]
    progress = [m["params"] for m in messages[:3]]
    assert [p["progress"] for p in progress] == [0, 50, 100]
    assert all(p["progressToken"] == "p-1" for p in progress)
    assert messages[3]["id"] == 7003 and "result" in messages[3]


def test_a_plain_call_can_be_cancelled(mcp, live_stack):
    elsewhere = on(mcp, live_stack.url)
    body = call("count_to", {"n": 200, "step_seconds": 0.05}, 7004, _meta={"progressToken": 9})
    started = time.monotonic()
    with mcp.stream(body) as stream:
        assert stream.next()["method"] == "notifications/progress"
        assert elsewhere.notify("notifications/cancelled", {"requestId": 7004, "reason": "enough"}).status == 202
        with pytest.raises(AssertionError, match="the stream ended"):
            while True:  # progress until the cancel lands, then the stream ends without a response
                message = stream.next()
                assert "id" not in message, message
    assert time.monotonic() - started < 8


def test_tasks_result_blocks_sends_the_questions_and_resumes(mcp, second_web, live_stack):
    elsewhere = on(mcp, second_web)
    task_id = mcp.create_task("confirm_delete", {"filename": "live.txt"})
    body = {"jsonrpc": "2.0", "id": 7100, "method": "tasks/result", "params": {"taskId": task_id}}
    with mcp.stream(body) as stream:
        request = stream.next()
        assert request["id"] == f"task:{task_id}:confirm"
        assert request["method"] == "elicitation/create"
        assert request["params"]["_meta"][RELATED] == {"taskId": task_id}
        assert mcp.request("tasks/get", {"taskId": task_id}).result["status"] == "input_required"
        answer = {"action": "accept", "content": {"confirm": True}}
        assert elsewhere.respond(request["id"], answer).status == 202
        final = stream.next()
    assert final["id"] == 7100
    assert final["result"]["content"][0]["text"] == "Deleted live.txt"
    assert final["result"]["_meta"][RELATED] == {"taskId": task_id}
    assert live_stack.task_row(task_id)["status"] == "completed"
    assert mcp.request("tasks/get", {"taskId": task_id}).result["status"] == "completed"


def test_tasks_result_ends_with_the_error_of_a_failed_task(mcp):
    task_id = mcp.create_task("protocol_error_job")
    body = {"jsonrpc": "2.0", "id": 7101, "method": "tasks/result", "params": {"taskId": task_id}}
    with mcp.stream(body) as stream:
        final = stream.next()
    assert final["id"] == 7101
    assert final["error"] == {"code": -32603, "message": "Simulated protocol error during execution"}


def test_tasks_result_of_a_task_that_already_failed_is_its_error(mcp, live_stack):
    """The task fails before ``tasks/result`` arrives (a fast worker): the
    server may answer with plain JSON instead of a stream, and a client must
    read either."""
    task_id = mcp.create_task("protocol_error_job")
    wait_until(lambda: (live_stack.task_row(task_id) or {}).get("status") == "failed", what="the task failed")
    body = {"jsonrpc": "2.0", "id": 7103, "method": "tasks/result", "params": {"taskId": task_id}}
    with mcp.stream(body) as stream:
        final = stream.next()
    assert final["id"] == 7103
    assert final["error"] == {"code": -32603, "message": "Simulated protocol error during execution"}


def test_tasks_result_ends_when_the_task_is_cancelled(mcp):
    task_id = mcp.create_task("slow_compute", {"seconds": 60})
    body = {"jsonrpc": "2.0", "id": 7102, "method": "tasks/result", "params": {"taskId": task_id}}
    outcome: dict[str, Any] = {}

    def wait() -> None:
        with mcp.stream(body) as stream:
            outcome.update(stream.next())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    assert mcp.request("tasks/cancel", {"taskId": task_id}).result["status"] == "cancelled"
    waiter.join(10)
    assert outcome["id"] == 7102 and outcome["error"]["data"]["status"] == "cancelled"


def test_the_session_stream_carries_status_notifications_and_ends_with_the_session(mcp, second_web):
    elsewhere = on(mcp, second_web)
    received: list[dict[str, Any]] = []
    opened = threading.Event()

    def listen() -> None:
        with elsewhere.stream(None) as stream:  # GET, on the other process
            assert stream.status == 200 and stream.content_type.startswith("text/event-stream")
            opened.set()
            try:
                while True:
                    received.append(stream.next())
            except AssertionError:
                pass  # the stream ended: the session was deleted

    listener = threading.Thread(target=listen)
    listener.start()
    assert opened.wait(10)
    time.sleep(0.3)
    task_id = mcp.create_task("slow_compute", {"seconds": 0.2, "label": "notify"})
    deadline = time.monotonic() + 10

    def statuses() -> list[str]:
        return [
            m["params"]["status"]
            for m in received
            if m["method"] == "notifications/tasks/status" and m["params"]["taskId"] == task_id
        ]

    while time.monotonic() < deadline and "completed" not in statuses():
        time.sleep(0.05)
    assert mcp.delete().status == 200
    listener.join(10)
    assert not listener.is_alive(), "deleting the session ends its stream"
    assert statuses() == ["working", "completed"], received
    assert not [m for m in received if "id" in m], "no responses or requests on the GET stream"
    assert mcp.request("tasks/list").status == 404


def test_blocked_streams_hold_no_thread_each(mcp, live_stack):
    """Fifty tasks/result calls waiting at once cost the web process no more
    threads than a handful (the shared executor), not one per stream."""
    web = live_stack.procs["web"].pid

    def threads() -> int:
        with open(f"/proc/{web}/status") as status:
            return int(next(line for line in status if line.startswith("Threads:")).split()[1])

    task_ids = [mcp.create_task("slow_compute", {"seconds": 30, "label": f"wait-{i}"}) for i in range(50)]
    before = threads()
    outcomes: list[dict[str, Any]] = []

    def wait(i: int, task_id: str) -> None:
        body = {"jsonrpc": "2.0", "id": 8000 + i, "method": "tasks/result", "params": {"taskId": task_id}}
        client = on(mcp, live_stack.url)
        with client.stream(body) as stream:
            outcomes.append(stream.next())
        client.close()

    waiters = [threading.Thread(target=wait, args=(i, t)) for i, t in enumerate(task_ids)]
    for waiter in waiters:
        waiter.start()
    time.sleep(2)
    during = threads()
    for task_id in task_ids:
        mcp.request("tasks/cancel", {"taskId": task_id})
    for waiter in waiters:
        waiter.join(60)  # generous: CI machines are loaded; the wake-up itself is not timed here
    assert during - before < 20, f"{during - before} more threads for 50 open streams"
    assert len(outcomes) == 50
    assert all(o["error"]["data"]["status"] == "cancelled" for o in outcomes), outcomes
