"""Task status notifications on a ``subscriptions/listen`` stream, live.

The worker process changes the task; the web process pushes each change to
the subscriber through the Redis channel layer. Every notification must be
the full DetailedTask tasks/get would return, tagged with the subscription.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from typing import Any

import httpx
import pytest

from tests.support import postgres_only
from tests.support.rpc import FULL_CAPS, NO_CAPS, HttpRpc, build_headers, build_meta
from tests.support.schemas import TASKS, assert_valid

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
_ids = itertools.count(9000)


class Listen:
    """One open ``subscriptions/listen`` stream, read on a thread."""

    def __init__(self, url: str, task_ids: list[str], caps: dict[str, Any] = FULL_CAPS) -> None:
        self.request_id = next(_ids)
        params = {"notifications": {"taskIds": task_ids}, "_meta": build_meta(caps)}
        self.body = {"jsonrpc": "2.0", "id": self.request_id, "method": "subscriptions/listen", "params": params}
        self.headers = build_headers("subscriptions/listen", params)
        self.messages: queue.Queue[Any] = queue.Queue()
        self.status: int | None = None
        self.content_type = ""
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._response: httpx.Response | None = None
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()
        assert self._opened.wait(10), "the listen request got no response headers"

    def _run(self, url: str) -> None:
        try:
            with self._client.stream("POST", url, content=json.dumps(self.body), headers=self.headers) as response:
                self._response = response
                self.status = response.status_code
                self.content_type = response.headers.get("content-type", "")
                self._opened.set()
                if not self.content_type.startswith("text/event-stream"):
                    self.messages.put(json.loads(response.read()))
                    return
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.messages.put(json.loads(line[5:].strip()))
        except (httpx.HTTPError, RuntimeError):
            pass  # closed by close()
        finally:
            self._opened.set()
            self.messages.put(None)

    def next(self, timeout: float = 10) -> dict[str, Any]:
        message = self.messages.get(timeout=timeout)
        assert message is not None, "the stream ended"
        return message

    def until(self, predicate, timeout: float = 15) -> list[dict[str, Any]]:
        """Messages up to and including the first matching ``predicate``."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no matching notification in {timeout}s; saw {seen}"
            message = self.next(remaining)
            seen.append(message)
            if predicate(message):
                return seen

    def close(self) -> None:
        # The reader thread (a daemon) ends at its next read of the closed stream.
        if self._response is not None:
            self._response.close()
        self._client.close()
        self._thread.join(0.5)


def check_task_notification(message: dict[str, Any], listen: Listen) -> dict[str, Any]:
    assert message["method"] == "notifications/tasks", message
    assert_valid(TASKS, "TaskStatusNotification", message)
    assert message["params"]["_meta"][SUBSCRIPTION_ID] == listen.request_id
    return message["params"]


def same_task(notification: dict[str, Any], got: dict[str, Any]) -> None:
    """The notification carries what tasks/get returns (less the result envelope)."""
    strip = ("_meta", "resultType")
    assert {k: v for k, v in notification.items() if k not in strip} == {k: v for k, v in got.items() if k not in strip}


def test_task_changes_stream_to_the_subscriber(live, live_stack):
    task_id = live.create_task("confirm_delete", {"filename": "watched.txt"})
    listen = Listen(live_stack.url, [task_id])
    try:
        assert listen.status == 200
        assert listen.content_type.startswith("text/event-stream")
        ack = listen.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["notifications"]["taskIds"] == [task_id]
        assert ack["params"]["_meta"][SUBSCRIPTION_ID] == listen.request_id

        seen = listen.until(lambda m: m.get("params", {}).get("status") == "input_required")
        waiting = check_task_notification(seen[-1], listen)
        assert set(waiting["inputRequests"]) == {"confirm"}
        for message in seen:
            check_task_notification(message, listen)
        same_task(waiting, live.tasks_get(task_id).result)

        live.tasks_update(task_id, {"confirm": {"action": "accept", "content": {"confirm": True}}})
        seen = listen.until(lambda m: m.get("params", {}).get("status") == "completed")
        for message in seen:
            check_task_notification(message, listen)
        done = check_task_notification(seen[-1], listen)
        assert "watched.txt" in done["result"]["content"][0]["text"]
        same_task(done, live.tasks_get(task_id).result)
        for message in seen:
            assert message["method"] not in ("notifications/progress", "notifications/message")
    finally:
        listen.close()


def test_a_subscription_sees_the_current_state_first(live, live_stack):
    task_id = live.create_task("slow_compute", {"seconds": 0, "label": "already"})
    assert live.wait_for(task_id)["status"] == "completed"
    listen = Listen(live_stack.url, [task_id])
    try:
        assert listen.next()["method"] == "notifications/subscriptions/acknowledged"
        current = check_task_notification(listen.next(), listen)
        assert current["status"] == "completed"
        same_task(current, live.tasks_get(task_id).result)
    finally:
        listen.close()


def test_task_notifications_need_the_extension(live_stack):
    listen = Listen(live_stack.url, ["any-task-id"], caps=NO_CAPS)
    try:
        reply = listen.next()
        assert reply["error"]["code"] == -32021
        assert reply["error"]["data"]["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"] == {}
        assert listen.status == 400
    finally:
        listen.close()


def test_someone_elses_task_is_left_out_of_the_acknowledgement(live, live_stack):
    token = live_stack.create_user_token("listen-stranger")
    theirs = HttpRpc(live_stack.url, token=token)
    try:
        task_id = theirs.create_task("slow_compute", {"seconds": 60, "label": "private"})
        listen = Listen(live_stack.url, [task_id, "no-such-task"])
        try:
            ack = listen.next()
            assert ack["params"]["notifications"]["taskIds"] == []
            theirs.tasks_cancel(task_id)
            with pytest.raises(queue.Empty):
                extra = listen.messages.get(timeout=1.5)
                if extra is None or "task" not in json.dumps(extra):  # keep-alives are not messages
                    raise queue.Empty
        finally:
            listen.close()
    finally:
        theirs.close()
