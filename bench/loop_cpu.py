"""CPU of the web process's event-loop path per ``tools/call`` and per ``tasks/get``, in one process.

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... CELERY_BROKER_URL=redis://... \
        CONN_MAX_AGE=300 python -m bench.loop_cpu [requests] [--profile]

Sends ``requests`` no-op ``tools/call`` requests, then one ``tasks/get`` of each
new task, straight into ``project.asgi:application`` on one event loop (no HTTP
server, no socket), one at a time, as uvicorn would hand them over (the tests'
``apost``), and prints the process CPU per request (every thread's). The tasks are
created and their runs published, but no worker runs them: each poll reads a
working task. With ``--profile`` it prints cProfile's top functions of the
creations (this thread only) instead. Indicative only: the figure moves with the
machine's load.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from project.asgi import application  # sets Django up
from tests.support.asgi import apost
from tests.support.rpc import build_headers, build_meta


async def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request through the ASGI app (``tests.support.asgi``); its JSON-RPC result (an error raises)."""
    params = {**params, "_meta": build_meta()}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    status, _headers, raw = await apost(application, body, build_headers(method, params))
    answer = json.loads(raw)
    if status != 200 or "result" not in answer:
        raise RuntimeError(f"{method}: HTTP {status}: {answer}")
    return answer["result"]


def create() -> Any:
    return request("tools/call", {"name": "noop", "arguments": {}})


async def main() -> None:
    count = int(next((a for a in sys.argv[1:] if a.isdigit()), "1000"))
    for _ in range(50):  # warm up: the identity cache, the loop's connections, the run's message template
        await create()
    if "--profile" in sys.argv:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(count):
            await create()
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        return
    cpu = time.process_time()
    ids = [(await create())["taskId"] for _ in range(count)]
    created = time.process_time() - cpu
    cpu = time.process_time()
    for task_id in ids:
        await request("tasks/get", {"taskId": task_id})
    polled = time.process_time() - cpu
    print(
        json.dumps(
            {
                "requests": count,
                "tools_call_cpu_ms": round(created * 1000 / count, 3),
                "tasks_get_cpu_ms": round(polled * 1000 / count, 3),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
