"""The peer: fastmcp-tasks (FastMCP 4 + Docket on Redis) serving the same three
bench tools as mcptasks, as required tasks.

Runs only in the peer's own virtualenv (see bench/envs.py). Configured from the
environment, the way fastmcp-tasks documents it:

    FASTMCP_DOCKET_URL=redis://127.0.0.1:6379/3   # the Docket backend
    FASTMCP_DOCKET_NAME=bench-peer                # the queue name

Web (the ASGI app also runs fastmcp-tasks' in-process Docket worker, as it
always does):

    python -m uvicorn bench.peer_server:app --port 8100

Extra worker processes (fastmcp-tasks' own worker CLI):

    python -m fastmcp_tasks.worker_cli worker bench/peer_server.py:mcp
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

from fastmcp import Context, FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension

POLL_MS = int(os.environ.get("BENCH_POLL_INTERVAL_MS", "500"))

mcp = FastMCP("bench-peer")
mcp.add_extension(TasksExtension())

_TASK = TaskConfig(mode="required", poll_interval=timedelta(milliseconds=POLL_MS))


@mcp.tool(task=_TASK, description="Does nothing (a bench fixture).")
async def noop() -> str:
    return "ok"


@mcp.tool(task=_TASK, description="Sleeps for `seconds` (a bench fixture).")
async def sleep(seconds: float = 1.0) -> str:
    await asyncio.sleep(seconds)
    return f"slept {seconds}s"


@mcp.tool(task=_TASK, description="Reports its progress ten times, then returns (a bench fixture).")
async def steps(ctx: Context) -> str:
    for step in range(1, 11):
        await ctx.report_progress(step, 10, f"step {step} of 10")
    return "ok"


# Sessionless modern wire; plain JSON answers (no SSE framing), as mcptasks does.
app = mcp.http_app(path="/mcp", stateless_http=True, json_response=True)
