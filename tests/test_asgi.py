"""The ASGI route for /mcp (mcptasks.asgi), driven in-process as a server would."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.core.asgi import get_asgi_application

from mcptasks.models import Task
from mcptasks.web.asgi import mcp_router
from tests.support.rpc import build_headers, build_meta

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(body: bytes, method: str, params: dict[str, Any]) -> dict[str, Any]:
    headers = [(name.lower().encode(), value.encode()) for name, value in build_headers(method, params).items()]
    headers += [
        (b"host", b"testserver"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


def serve(method: str, params: dict[str, Any], on_send: Any = None) -> tuple[int, dict[str, Any]]:
    """One request through ``mcp_router``; ``on_send(message)`` sees each
    message as the server would send it."""
    params = {**params, "_meta": build_meta()}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    app = mcp_router(get_asgi_application(), path="/mcp")
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        finished = asyncio.Event()
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if on_send is not None:
                on_send(message)

        await app(_scope(body, method, params), receive, send)
        finished.set()

    asyncio.run(run())
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(payload)


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
