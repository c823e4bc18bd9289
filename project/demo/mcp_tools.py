"""Demo tools, including the fixtures the conformance suite calls."""

from mcptasks import ToolContext, ToolError, tool
from mcptasks.errors import INTERNAL_ERROR, ProtocolError


@tool(description="Say hello.")
def greet(name: str) -> str:
    return f"Hello, {name}!"


@tool(task="optional", description="Sleep for a while (cancellable), then report.")
def slow_compute(ctx: ToolContext, seconds: float = 1.0, label: str = "result") -> str:
    ctx.report_status(f"Computing {label}...")
    ctx.sleep(seconds)
    return f"{label}: computed after {seconds}s"


@tool(task="required", description="A job that always ends with a tool error.")
def failing_job(ctx: ToolContext) -> str:
    raise ToolError("The job failed: simulated tool error")


@tool(task="required", description="A job that ends with a JSON-RPC error.")
def protocol_error_job(ctx: ToolContext) -> str:
    raise ProtocolError(INTERNAL_ERROR, "Simulated protocol error")


@tool(task="required", description="Delete a file, after asking the user to confirm.")
def confirm_delete(ctx: ToolContext, filename: str) -> str:
    answer = ctx.elicit(
        f"Delete {filename}?",
        {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
        key="confirm",
    )
    if answer.get("action") == "accept" and (answer.get("content") or {}).get("confirm"):
        return f"Deleted {filename}"
    return f"Kept {filename}"


@tool(task="required", description="Ask two questions at once.")
def multi_input(ctx: ToolContext) -> str:
    from mcptasks import elicitation

    answers = ctx.ask(
        {
            "first_name": elicitation(
                "Your first name?", {"type": "object", "properties": {"name": {"type": "string"}}}
            ),
            "last_name": elicitation("Your last name?", {"type": "object", "properties": {"name": {"type": "string"}}}),
        }
    )
    first = (answers["first_name"].get("content") or {}).get("name", "")
    last = (answers["last_name"].get("content") or {}).get("name", "")
    return f"Hello, {first} {last}!"


@tool(task="required", starts_inline=True, description="Ask for a name first, then run as a task.")
def test_tool_with_task(ctx: ToolContext) -> str:
    answer = ctx.elicit(
        "What is your name?",
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        key="name",
    )
    ctx.hand_off()
    name = (answer.get("content") or {}).get("name", "stranger")
    return f"Hello, {name}! (from a task)"
