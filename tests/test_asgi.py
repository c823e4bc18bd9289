"""The ASGI route for /mcp (mcptasks.asgi), driven in-process as a server would."""

from __future__ import annotations

from typing import Any

import pytest

from mcptasks.models import Task
from tests.support.asgi import serve_asgi

pytestmark = pytest.mark.django_db(transaction=True)


def serve(method: str, params: dict[str, Any], on_send: Any = None) -> tuple[int, dict[str, Any]]:
    """One request through ``mcp_router``; ``on_send(message)`` sees each
    message as the server would send it."""
    status, _, payload = serve_asgi(method, params, on_send=on_send)
    return status, payload


def test_a_created_run_is_published_before_the_answer_is_sent(published):
    """A client that has its task handle has a run on its way: a web process
    killed right after answering loses nothing, not even time."""
    runs_when_answered: list[int] = []

    def on_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            runs_when_answered.append(sum(1 for m in published if m["task"] == "mcptasks.run_task"))

    status, reply = serve("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}}, on_send)
    assert status == 200, reply
    task_id = reply["result"]["taskId"]
    assert runs_when_answered == [1]
    assert [m["args"] for m in published if m["task"] == "mcptasks.run_task"] == [[task_id]]
    assert Task.objects.filter(pk=task_id).exists()


def test_a_poll_through_the_asgi_route():
    status, created = serve("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}})
    assert status == 200, created
    task_id = created["result"]["taskId"]
    status, got = serve("tasks/get", {"taskId": task_id})
    assert status == 200, got
    assert got["result"]["taskId"] == task_id
    assert got["result"]["status"] == "working"
