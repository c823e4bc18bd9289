"""A ``subscriptions/listen`` stream outlives a quiet spell.

A client that subscribes to a slow task may hear nothing for minutes; the
stream must stay open (with a keep-alive comment every ``KEEPALIVE_SECONDS``)
and still deliver the task's next change. With the example site's Redis
channel layer an idle receive can end in the Redis client's own socket
timeout (redis-py 8 reads with a 5 s timeout by default, while
channels-redis blocks for 5 s in ``BZPOPMIN``); that must read as "no message
yet", never end the stream.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.support import postgres_only
from tests.support.rpc import TASKS_CAPS, HttpRpc, build_headers, build_meta

pytestmark = [pytest.mark.live, postgres_only.CHAOS]

#: Longer than the Redis client's default read timeout (5 s).
QUIET_SECONDS = 8.0


def test_idle_listen_stream_stays_open_and_delivers_the_next_change(chaos_stack_factory):
    stack = chaos_stack_factory(workers=1, concurrency=2, sweeper=False)
    client = HttpRpc(stack.url, validate=False)
    try:
        task_id = client.create_task("slow_compute", {"seconds": 600, "label": "idle"})
        client.wait_for(task_id, {"working"})
        params = {"notifications": {"taskIds": [task_id]}, "_meta": build_meta(TASKS_CAPS)}
        headers = {"Content-Type": "application/json", **build_headers("subscriptions/listen", params)}
        body = {"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen", "params": params}
        messages: list[dict[str, Any]] = []
        ended: list[str] = []
        opened = threading.Event()

        def listen() -> None:
            try:
                with httpx.stream("POST", stack.url, json=body, headers=headers, timeout=60) as response:
                    opened.set()
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            messages.append(json.loads(line[5:]))
                            if messages[-1].get("params", {}).get("status") == "cancelled":
                                return
                ended.append("the server ended the stream")
            except httpx.HTTPError as exc:
                ended.append(f"{type(exc).__name__}: {exc}")
            finally:
                opened.set()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        assert opened.wait(30)
        time.sleep(QUIET_SECONDS)
        assert not ended, f"the stream died after {QUIET_SECONDS:.0f} s of quiet: {ended}"
        assert client.tasks_cancel(task_id).status == 200
        listener.join(30)
        statuses = [m["params"].get("status") for m in messages if m.get("method") == "notifications/tasks"]
        assert "cancelled" in statuses, f"no cancel pushed after the quiet spell: {messages} {ended}"
    finally:
        client.close()
