"""The bench tools: ``noop``, ``sleep`` and ``steps`` are the same as the peer's
(bench/peer_server.py); ``gated`` is for the listen-stream bench
(bench/listen.py) and has no counterpart there."""

import random

from mcptasks import ToolContext, tool


@tool(task="required", description="Does nothing (a bench fixture).")
def noop() -> str:
    return "ok"


@tool(task="required", description="Sleeps for `seconds` (a bench fixture).")
def sleep(ctx: ToolContext, seconds: float = 1.0) -> str:
    ctx.sleep(seconds)
    return f"slept {seconds}s"


@tool(task="required", description="Reports its progress ten times, then returns (a bench fixture).")
def steps(ctx: ToolContext) -> str:
    for step in range(1, 11):
        ctx.report_progress(step, 10, f"step {step} of 10")
    return "ok"


@tool(
    task="required",
    description="Waits for a go-ahead, then reports `steps` status messages, sleeping up to "
    "`max_seconds` after each, and ends (a bench fixture).",
)
def gated(ctx: ToolContext, steps: int = 2, max_seconds: float = 0.2) -> str:
    # A task waiting for input holds no worker: thousands can wait at once,
    # and the bench starts them, at the pace it chooses, by answering.
    ctx.elicit("Go?", key="go")
    for step in range(1, steps + 1):
        ctx.report_status(f"step {step}")
        ctx.sleep(random.uniform(0.0, max_seconds))
    return "done"
