"""The test site's tools, resources and prompts: the fixtures that the
official conformance suite calls (``test_*``, ``greet``, ``slow_compute``,
...) and the ones the suite's own tests drive (input requests, cancellation,
failures, scopes). The example site's demo tools began as these; the two
evolve apart, and a change here is a change to what the tests rely on.
"""

import json
import logging
import time

from mcptasks import (
    INTERNAL_ERROR,
    MissingCapability,
    ProtocolError,
    SoftTimeLimitExceeded,
    TaskCancelled,
    ToolContext,
    ToolError,
    ToolResult,
    audio,
    elicitation,
    image,
    prompt,
    registry,
    resource,
    resource_template,
    roots,
    sampling,
    text,
    tool,
)

#: What the tools leave for the tests to read (``sleep_inline``'s cancels).
logger = logging.getLogger("tests.testapp")

PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_TINY = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _content(answer: dict, field: str, default: str = "") -> str:
    return str((answer.get("content") or {}).get(field, default)) if answer.get("action") == "accept" else default


def _sampled_text(answer: dict) -> str:
    content = answer.get("content") or {}
    return content.get("text", "") if isinstance(content, dict) else ""


# Plain tools ----------------------------------------------------------------------


@tool(description="Returns a simple text response.")
def test_simple_text() -> str:
    return "This is a simple text response for testing."


@tool(description="Says hello.")
def greet(name: str) -> str:
    return f"Hello, {name}!"


@tool(description="Returns a small PNG image.")
def test_image_content() -> dict:
    return image(PNG_1X1, "image/png")


@tool(description="Returns a short WAV clip.")
def test_audio_content() -> dict:
    return audio(WAV_TINY, "audio/wav")


@tool(description="Returns an embedded text resource.")
def test_embedded_resource() -> dict:
    return {
        "type": "resource",
        "resource": {
            "uri": "test://embedded-resource",
            "mimeType": "text/plain",
            "text": "This is an embedded resource content.",
        },
    }


@tool(description="Returns text, an image and an embedded resource.")
def test_multiple_content_types() -> list:
    return [
        text("Multiple content types test:"),
        image(PNG_1X1, "image/png"),
        {
            "type": "resource",
            "resource": {
                "uri": "test://mixed-content-resource",
                "mimeType": "application/json",
                "text": '{"test":"data","value":123}',
            },
        },
    ]


@tool(description="Always fails with a tool error.")
def test_error_handling() -> str:
    raise ToolError("This tool intentionally returns an error for testing")


@tool(description="Reports progress three times, then finishes.")
def test_tool_with_progress(ctx: ToolContext) -> str:
    for step in (0, 50, 100):
        ctx.report_progress(step, 100, f"step {step}")
        if step < 100:
            ctx.sleep(0.05)
    return "Progress tool finished."


@tool(description="Logs three messages (when the request sets a log level), then finishes.")
def test_logging_tool(ctx: ToolContext) -> str:
    ctx.log("info", "Tool execution started")
    ctx.log("info", "Tool processing data")
    ctx.log("info", "Tool execution completed")
    return "Tool with logging executed successfully"


@tool(description="Needs the client's sampling capability.")
def test_missing_capability(ctx: ToolContext) -> str:
    if not ctx.can("sampling"):
        raise MissingCapability({"sampling": {}}, "This tool needs the client capability 'sampling'.")
    answer = ctx.sample("Say something.", max_tokens=20, key="say")
    return f"The model said: {_sampled_text(answer)}"


@tool(description="Asks the user one question (MRTR).")
def test_streaming_elicitation(ctx: ToolContext) -> str:
    answer = ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    return f"Hello, {_content(answer, 'name', 'stranger')}!"


@tool(
    description="Runs a query in a region (the region is mirrored into the Mcp-Param-Region header).",
    input_schema={
        "type": "object",
        "properties": {
            "region": {"type": "string", "description": "Where to run", "x-mcp-header": "Region"},
            "query": {"type": "string", "description": "What to run"},
        },
        "required": ["region", "query"],
    },
)
def regional_query(region: str, query: str) -> str:
    return f"Ran {query!r} in {region}"


@tool(
    description="Tool with JSON Schema 2020-12 features",
    input_schema={
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "$anchor": "addressDef",
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            }
        },
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": False,
    },
)
def json_schema_2020_12_tool(
    name: str | None = None,
    address: dict | None = None,
    contactMethod: str | None = None,
    phone: str | None = None,
    email: str | None = None,
) -> str:
    return f"Contact {name or 'someone'} by {contactMethod or 'email'}: {phone or email or '(none)'}"


# MRTR fixtures (input-required-result-*) --------------------------------------------


@tool(description="Asks for the user's name (MRTR elicitation).")
def test_input_required_result_elicitation(ctx: ToolContext) -> str:
    answer = ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    return f"Hello, {_content(answer, 'name', 'stranger')}!"


@tool(description="Asks the client's model a question (MRTR sampling).")
def test_input_required_result_sampling(ctx: ToolContext) -> str:
    answer = ctx.sample("What is the capital of France?", max_tokens=100, key="capital_question")
    return f"The model answered: {_sampled_text(answer)}"


@tool(description="Asks for the client's roots (MRTR roots/list).")
def test_input_required_result_list_roots(ctx: ToolContext) -> str:
    answer = ctx.list_roots(key="client_roots")
    uris = [r.get("uri", "") for r in answer.get("roots", []) if isinstance(r, dict)]
    return f"Client roots: {', '.join(uris) or '(none)'}"


@tool(description="Asks for confirmation, carrying state across the round trip.")
def test_input_required_result_request_state(ctx: ToolContext) -> str:
    answer = ctx.elicit(
        "Please confirm.",
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        key="confirm",
    )
    return "state-ok" if (answer.get("content") or {}).get("ok") else "state-not-confirmed"


@tool(description="Asks three questions at once: elicitation, sampling and roots.")
def test_input_required_result_multiple_inputs(ctx: ToolContext) -> str:
    answers = ctx.ask(
        {
            "user_name": elicitation("What is your name?", NAME_SCHEMA),
            "greeting": sampling("Generate a greeting", max_tokens=50),
            "client_roots": roots(),
        }
    )
    name = _content(answers["user_name"], "name", "stranger")
    return f"{_sampled_text(answers['greeting'])} {name} ({len(answers['client_roots'].get('roots', []))} roots)"


@tool(description="Asks two questions, one round each.")
def test_input_required_result_multi_round(ctx: ToolContext) -> str:
    name = _content(ctx.elicit("Step 1: What is your name?", NAME_SCHEMA, key="step1"), "name")
    color_schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    color = _content(ctx.elicit("Step 2: What is your favorite color?", color_schema, key="step2"), "color")
    return f"{name} likes {color}."


@tool(description="Asks one question; its requestState is integrity-protected.")
def test_input_required_result_tampered_state(ctx: ToolContext) -> str:
    answer = ctx.elicit(
        "Proceed?",
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        key="proceed",
    )
    return "Proceeded." if (answer.get("content") or {}).get("ok") else "Stopped."


@tool(description="Asks only what the client declared it can answer.")
def test_input_required_result_capabilities(ctx: ToolContext) -> str:
    questions = {}
    if ctx.can("elicitation"):
        questions["user_name"] = elicitation("What is your name?", NAME_SCHEMA)
    if ctx.can("sampling"):
        questions["summary"] = sampling("Summarize the weather.", max_tokens=50)
    if not questions:
        raise MissingCapability({"sampling": {}}, "This tool needs 'elicitation' or 'sampling'.")
    answers = ctx.ask(questions)
    return f"Got {len(answers)} answer(s)."


# Task fixtures (tasks-*) ----------------------------------------------------------


@tool(task="optional", description="Sleeps for `seconds` (cancellable), then reports.")
def slow_compute(ctx: ToolContext, seconds: float = 1.0, label: str = "result") -> str:
    ctx.report_status(f"Computing {label}")
    ctx.sleep(seconds)
    return f"computed {label} in {seconds}s"


@tool(task="required", description="A job that ends with a tool error (isError).")
def failing_job(ctx: ToolContext) -> str:
    ctx.sleep(0.2)
    raise ToolError("The job failed: simulated tool error")


@tool(task="required", description="A job that ends with a JSON-RPC error.")
def protocol_error_job(ctx: ToolContext) -> str:
    raise ProtocolError(INTERNAL_ERROR, "Simulated protocol error during execution")


@tool(task="required", scopes=["mcp:delete"], description="Deletes a file after the user confirms.")
def confirm_delete(ctx: ToolContext, filename: str) -> str:
    answer = ctx.elicit(
        f"Delete {filename}?",
        {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
        key="confirm",
    )
    # Writes go after the last question: a run that stops to ask must not have changed anything.
    if answer.get("action") == "accept" and (answer.get("content") or {}).get("confirm"):
        return f"Deleted {filename}"
    return f"Kept {filename}"


@tool(task="required", description="Asks two questions at once.")
def multi_input(ctx: ToolContext) -> str:
    answers = ctx.ask(
        {
            "first": elicitation("First answer?", NAME_SCHEMA),
            "second": elicitation("Second answer?", NAME_SCHEMA),
        }
    )
    return f"Got {_content(answers['first'], 'name')} and {_content(answers['second'], 'name')}."


@tool(task="required", starts_inline=True, description="Asks for a name (MRTR), then runs as a task.")
def test_tool_with_task(ctx: ToolContext) -> str:
    answer = ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    ctx.hand_off()
    ctx.sleep(0.1)
    return f"Hello, {_content(answer, 'name', 'stranger')}, from a task!"


@tool(task="auto", description="Finishes at once when quick, becomes a task when slow.")
def maybe_slow(ctx: ToolContext, seconds: float = 0.0) -> str:
    ctx.sleep(seconds)
    return f"slept {seconds}s"


@tool(description="Sleeps inline for `seconds`; logs it when the call is cancelled first (a client hang-up).")
def sleep_inline(ctx: ToolContext, seconds: float = 1.0, label: str = "sleep") -> str:
    started = time.monotonic()
    try:
        ctx.sleep(seconds)
    except TaskCancelled:
        logger.warning("sleep_inline %s: cancelled after %.2fs", label, time.monotonic() - started)
        raise
    return f"slept {seconds}s"


# Execution controls (tests/test_live_execution_controls.py sets their queues and limits
# through MCP_TOOL_CONTROLS) -------------------------------------------------------------


@tool(task="required", description="Waits with the context; cleans up (and logs it) at its soft time limit.")
def guarded_wait(ctx: ToolContext, seconds: float = 10.0) -> str:
    started = time.monotonic()
    try:
        ctx.sleep(seconds)
    except SoftTimeLimitExceeded:
        logger.warning("guarded_wait %s: cleaned up after %.2fs", ctx.task_id, time.monotonic() - started)
        raise
    return f"waited {seconds}s"


@tool(task="required", description="Sleeps without looking at its context (only a hard time limit stops it).")
def stubborn_wait(seconds: float = 10.0) -> str:
    time.sleep(seconds)
    return f"slept {seconds}s"


@tool(
    task="required",
    retries=3,
    retry_on=(ConnectionError,),
    retry_backoff=0.5,
    retry_backoff_max=1.0,
    description="Raises ConnectionError (retried) until attempt `succeed_on`, or KeyError (not retried).",
)
def flaky_call(ctx: ToolContext, succeed_on: int = 3, error: str = "ConnectionError") -> str:
    if ctx.attempt < succeed_on:
        raise (
            KeyError("not a retried error")
            if error == "KeyError"
            else ConnectionError(f"refused (attempt {ctx.attempt})")
        )
    return f"answered on attempt {ctx.attempt}"


@tool(task="required", description="Calls an API that is always down (its retries come from MCP_TOOL_CONTROLS).")
def unreachable_api(ctx: ToolContext) -> str:
    raise ConnectionError(f"no route to the API (attempt {ctx.attempt})")


@tool(task="required", description="Works `seconds`, logging its start and end (wall clock) for overlap checks.")
def limited_work(ctx: ToolContext, seconds: float = 0.5) -> str:
    logger.warning("limited_work %s start %.6f", ctx.task_id, time.time())
    try:
        ctx.sleep(seconds)
    finally:
        logger.warning("limited_work %s end %.6f", ctx.task_id, time.time())
    return f"worked {seconds}s"


@tool(task="optional", description="Busy work that checks for cancellation between steps.")
def count_to(ctx: ToolContext, n: int = 10, step_seconds: float = 0.1) -> ToolResult:
    done = 0
    for i in range(n):
        ctx.check_cancelled()
        time.sleep(step_seconds)
        done = i + 1
        ctx.report_progress(done, n, f"{done}/{n}")
    return ToolResult([text(f"counted to {done}")], structured={"count": done})


@tool(task="required", description="Reports the wall clock as its status, every few milliseconds.")
def report_clock(ctx: ToolContext, seconds: float = 5.0) -> str:
    # A killed run's last written message tells how much of its reports it lost.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        ctx.report_status(f"{time.time():.3f}")
        time.sleep(0.002)
    return "clock stopped"


# Resources and prompts -----------------------------------------------------------------


@resource("test://static-text", name="Static text", description="A static text resource.")
def static_text() -> str:
    return "This is the content of the static text resource."


@resource("test://static-binary", name="Static binary", description="A static PNG.", mime_type="image/png")
def static_binary() -> dict:
    return {"blob": PNG_1X1}


@resource("test://watched-resource", name="Watched resource", description="A resource that can change.")
def watched_resource() -> str:
    return "Watched resource content."


@resource_template(
    "test://template/{id}/data", name="Templated data", description="Data for an id.", mime_type="application/json"
)
def templated_data(id: str) -> str:
    return f'{{"id":"{id}","templateTest":true,"data":"Data for ID: {id}"}}'


@prompt(description="A simple prompt.")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@prompt(
    description="A prompt with two arguments.",
    completions={"arg1": lambda value: [v for v in ("test", "testValue1", "other") if v.startswith(value)]},
)
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@prompt(description="A prompt with an embedded resource.")
def test_prompt_with_embedded_resource(resourceUri: str) -> list:
    return [
        {
            "role": "user",
            "content": {
                "type": "resource",
                "resource": {
                    "uri": resourceUri,
                    "mimeType": "text/plain",
                    "text": "Embedded resource content for testing.",
                },
            },
        },
        {"role": "user", "content": {"type": "text", "text": "Please process the embedded resource above."}},
    ]


@prompt(description="A prompt with an image.")
def test_prompt_with_image() -> list:
    return [
        {"role": "user", "content": {"type": "image", "data": PNG_1X1, "mimeType": "image/png"}},
        {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}},
    ]


@prompt(description="Asks the user for context before building the prompt (MRTR).")
def test_input_required_result_prompt(ctx: ToolContext) -> str:
    answer = ctx.elicit(
        "What context should the prompt use?",
        {"type": "object", "properties": {"context": {"type": "string"}}, "required": ["context"]},
        key="user_context",
    )
    return f"Use this context: {_content(answer, 'context')}"


# List-changed triggers (server-stateless) -------------------------------------------


def _dynamic_tool() -> str:
    return "I come and go."


@tool(description="Adds or removes a tool, so that list-changed notifications go out.")
def test_trigger_tool_change() -> str:
    if "dynamic_tool" in registry:
        registry.unregister("dynamic_tool")
        return "Removed dynamic_tool."
    tool(_dynamic_tool, name="dynamic_tool", description="A tool that comes and goes.")
    return "Added dynamic_tool."


@tool(description="Adds or removes a prompt, so that list-changed notifications go out.")
def test_trigger_prompt_change() -> str:
    if "dynamic_prompt" in registry.prompts:
        registry.remove_prompt("dynamic_prompt")
        return "Removed dynamic_prompt."
    prompt(lambda: "I come and go.", name="dynamic_prompt", description="A prompt that comes and goes.")
    return "Added dynamic_prompt."


# 2025-11-25 fixtures (the session wire: tools/call asks the client over SSE) -----------------


@tool(description="Logs three messages at level info (sent once the client set a log level), then finishes.")
def test_tool_with_logging(ctx: ToolContext) -> str:
    ctx.log("info", "Tool execution started")
    ctx.sleep(0.05)
    ctx.log("info", "Tool processing data")
    ctx.sleep(0.05)
    ctx.log("info", "Tool execution completed")
    return "Tool with logging executed successfully"


@tool(description="Asks the client's model to answer a prompt (sampling).")
def test_sampling(ctx: ToolContext, prompt: str) -> str:
    answer = ctx.sample(prompt, max_tokens=100, key="prompt")
    return f"LLM response: {_sampled_text(answer)}"


@tool(description="Asks the user for a username and an email address (elicitation).")
def test_elicitation(ctx: ToolContext, message: str) -> str:
    schema = {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    }
    answer = ctx.elicit(message, schema, key="user_info")
    return f"User response: action={answer.get('action')}, content={json.dumps(answer.get('content') or {})}"


@tool(description="Asks the user to review a form whose fields have default values (SEP-1034).")
def test_elicitation_sep1034_defaults(ctx: ToolContext) -> str:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    answer = ctx.elicit("Please review and update the form fields with defaults", schema, key="defaults")
    return f"Elicitation completed: action={answer.get('action')}, content={json.dumps(answer.get('content') or {})}"


@tool(description="Asks the user to pick from every kind of enum field (SEP-1330).")
def test_elicitation_sep1330_enums(ctx: ToolContext) -> str:
    titled = [{"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"}]
    titled.append({"const": "value3", "title": "Third Option"})
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {"type": "string", "oneOf": titled},
            "legacyEnum": {
                "type": "string",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
            },
            "titledMulti": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"},
                    ]
                },
            },
        },
        "required": [],
    }
    answer = ctx.elicit("Please choose from the options", schema, key="enums")
    return f"Elicitation completed: action={answer.get('action')}, content={json.dumps(answer.get('content') or {})}"


@tool(task="optional", description="Asks the client's model for a one-line summary of a text (sampling, as a task).")
def summarize(ctx: ToolContext, passage: str) -> str:
    answer = ctx.sample(f"Summarize in one line: {passage}", max_tokens=60, key="summary")
    return f"Summary: {_sampled_text(answer)}"
