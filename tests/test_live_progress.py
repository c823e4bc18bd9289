"""Coalesced progress on the live stack: what listeners of both eras receive
of a task's reports, and what a killed worker loses of them.

The worker reports through its process's status writer (at most one write
per ``STATUS_INTERVAL_SECONDS``, 0.25 s by default); the web process streams
each written change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import postgres_only
from tests.support.legacy import RELATED, HttpLegacy
from tests.test_live_notifications import Listen, check_task_notification
from tests.test_live_recovery import kill_run, lease_pid, sweep_until, wait_for_new_run

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

INTERVAL = 0.25  # the default STATUS_INTERVAL_SECONDS, which the live stack keeps


@pytest.fixture
def mcp(live_stack: Any) -> Iterator[HttpLegacy]:
    client = HttpLegacy(live_stack.url)
    client.initialize()
    try:
        yield client
    finally:
        client.close()


def test_a_2025_task_with_a_progress_token_sends_notifications_progress_on_the_session_stream(mcp):
    received: list[dict[str, Any]] = []
    opened = threading.Event()
    done = threading.Event()

    def listen() -> None:
        with mcp.stream(None) as stream:  # the session's GET stream
            opened.set()
            while not done.is_set():
                message = stream.next()
                received.append(message)
                if message["method"] == "notifications/tasks/status" and message["params"]["status"] == "completed":
                    done.set()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert opened.wait(10)
    time.sleep(0.3)
    reply = mcp.call_tool(
        "count_to", {"n": 20, "step_seconds": 0.05}, task={"ttl": 60_000}, _meta={"progressToken": "steps-1"}
    )
    assert reply.status == 200 and "task" in reply.result, reply
    task_id = reply.result["task"]["taskId"]
    assert done.wait(30), received
    progress = [m["params"] for m in received if m["method"] == "notifications/progress"]
    print(f"\n{len(progress)} notifications/progress for 20 reports over about 1 s")
    assert progress, received
    assert all(p["progressToken"] == "steps-1" and p["total"] == 20 for p in progress), progress
    assert all(p["message"] == f"{p['progress']}/20" for p in progress), progress
    assert all(p["_meta"][RELATED]["taskId"] == task_id for p in progress), progress
    numbers = [p["progress"] for p in progress]
    assert numbers == sorted(set(numbers)), numbers  # in order, each once
    assert len(progress) <= 20 * 0.05 / INTERVAL + 3  # coalesced: about one per interval
    assert received[-1]["method"] == "notifications/tasks/status"  # the reports came before the completion


def test_a_task_without_a_progress_token_sends_no_progress(mcp):
    received: list[dict[str, Any]] = []
    opened = threading.Event()
    done = threading.Event()

    def listen() -> None:
        with mcp.stream(None) as stream:
            opened.set()
            while not done.is_set():
                message = stream.next()
                received.append(message)
                if message["method"] == "notifications/tasks/status" and message["params"]["status"] == "completed":
                    done.set()

    threading.Thread(target=listen, daemon=True).start()
    assert opened.wait(10)
    time.sleep(0.3)
    mcp.create_task("count_to", {"n": 10, "step_seconds": 0.05})
    assert done.wait(30), received
    assert [m["method"] for m in received] == ["notifications/tasks/status"] * len(received)


def test_a_bad_progress_token_is_invalid_params(mcp):
    reply = mcp.call_tool("count_to", {"n": 1}, task={}, _meta={"progressToken": "x" * 300})
    assert reply.error["code"] == -32602, reply


def test_a_listener_sees_the_coalesced_messages_in_order(live, live_stack):
    task_id = live.create_task("count_to", {"n": 40, "step_seconds": 0.025})
    listen = Listen(live_stack.url, [task_id])
    try:
        assert listen.next()["method"] == "notifications/subscriptions/acknowledged"
        seen = [
            check_task_notification(message, listen)
            for message in listen.until(lambda m: m.get("params", {}).get("status") == "completed", timeout=30)
        ]
    finally:
        listen.close()
    messages = [n["statusMessage"] for n in seen if n["status"] == "working" and n.get("statusMessage")]
    print(f"\n{len(messages)} working notifications for 40 reports over about 1 s: {messages}")
    assert messages, seen
    counts = [int(message.split("/")[0]) for message in messages]
    assert counts == sorted(set(counts)), messages  # in order, each once
    assert len(messages) <= 40 * 0.025 / INTERVAL + 3
    assert seen[-1]["status"] == "completed"


def test_a_killed_worker_loses_at_most_an_interval_of_messages_and_no_task(live, live_stack):
    task_id = live.create_task("report_clock", {"seconds": 4})
    first = wait_for_new_run(live_stack, task_id, set())
    assert first["status"] == "working"
    time.sleep(1.0)  # the run has reported for a while
    killed = kill_run(live_stack, first)
    killed_at = time.time()
    time.sleep(0.5)  # whatever the killed process had written is committed by now
    row = live_stack.task_row(task_id)
    assert row["lease_owner"] == first["lease_owner"] and row["status"] == "working", row
    lost = killed_at - float(row["status_message"])
    print(f"\nthe last message written before the SIGKILL was {lost:.3f}s old")
    # One interval, plus the time the kill takes to land; never a message
    # from after the kill.
    assert 0 <= lost <= INTERVAL + 0.5, (lost, row)

    rerun = sweep_until(live_stack, task_id, lambda r: r["lease_owner"] not in ("", first["lease_owner"]))
    assert lease_pid(rerun["lease_owner"]) != killed
    final = live.wait_for(task_id, timeout=30)
    assert final["status"] == "completed", final
