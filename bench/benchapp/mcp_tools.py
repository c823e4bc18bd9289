"""The two bench tools, the same as the peer's (bench/peer_server.py)."""

from mcptasks import ToolContext, tool


@tool(task="required", description="Does nothing (a bench fixture).")
def noop() -> str:
    return "ok"


@tool(task="required", description="Sleeps for `seconds` (a bench fixture).")
def sleep(ctx: ToolContext, seconds: float = 1.0) -> str:
    ctx.sleep(seconds)
    return f"slept {seconds}s"
