"""Scenarios for the official Python SDK's 2025-11-25 client (``mcp==1.30.0``).

Run by tests/test_live_legacy_sdk.py as a subprocess of a dedicated virtualenv
(the test environment pins a later ``mcp``). It imports nothing from this
repository: only the SDK talks to the server, over HTTP.

    python legacy_sdk_client.py URL SCENARIO [SCENARIO ...] [--token T] [--task-id ID]

Prints one JSON document: ``{scenario: what it observed}``. A scenario that
raises reports ``{"exception": "..."}`` instead of stopping the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from typing import Any

import anyio
import httpx
import mcp.types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

warnings.simplefilter("ignore", DeprecationWarning)

RELATED = "io.modelcontextprotocol/related-task"
SAMPLED_TEXT = "Tasks travel well."


class Observer:
    """Callbacks for the session; records what the server sent."""

    def __init__(self) -> None:
        self.elicitations: list[dict[str, Any]] = []
        self.samplings: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        data = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.elicitations.append(data)
        properties = data.get("requestedSchema", {}).get("properties", {})
        if "confirm" in properties:
            return types.ElicitResult(action="accept", content={"confirm": True})
        if "username" in properties:
            return types.ElicitResult(action="accept", content={"username": "sdk-user", "email": "sdk@example.com"})
        return types.ElicitResult(action="accept", content={"name": "sdk"})

    async def sample(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.samplings.append(params.model_dump(mode="json", by_alias=True, exclude_none=True))
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=SAMPLED_TEXT),
            model="sdk-test-model",
            stopReason="endTurn",
        )

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            self.notifications.append(message.root.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params.model_dump(mode="json", by_alias=True, exclude_none=True))


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def texts(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def poll(session: ClientSession, task_id: str) -> list[str]:
    statuses = []
    async for status in session.experimental.poll_task(task_id):
        statuses.append(status.status)
    return statuses


async def run_task_to_result(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """call_tool_as_task, poll, and on input_required get the result through
    tasks/result (which carries the server's requests): the SDK's pattern."""
    created = await session.experimental.call_tool_as_task(name, arguments, ttl=120_000)
    task_id = created.task.taskId
    statuses: list[str] = []
    result: types.CallToolResult | None = None
    async for status in session.experimental.poll_task(task_id):
        statuses.append(status.status)
        if status.status == "input_required":
            result = await session.experimental.get_task_result(task_id, types.CallToolResult)
            break
    if result is None:
        result = await session.experimental.get_task_result(task_id, types.CallToolResult)
    final = await session.experimental.get_task(task_id)
    return {
        "created": dump(created),
        "statuses": statuses,
        "final": dump(final),
        "result": dump(result),
        "text": texts(result),
    }


async def scenario_capabilities(session: ClientSession, init: types.InitializeResult, **_: Any) -> dict[str, Any]:
    tools = await session.list_tools()
    return {
        "protocolVersion": init.protocolVersion,
        "capabilities": dump(init.capabilities),
        "taskSupport": {t.name: (t.execution.taskSupport if t.execution else None) for t in tools.tools},
    }


async def scenario_complete(session: ClientSession, **_: Any) -> dict[str, Any]:
    return await run_task_to_result(session, "slow_compute", {"seconds": 0.5, "label": "sdk"})


async def scenario_elicitation(session: ClientSession, observer: Observer, **_: Any) -> dict[str, Any]:
    out = await run_task_to_result(session, "confirm_delete", {"filename": "report.txt"})
    out["elicitations"] = observer.elicitations[-1:]
    return out


async def scenario_sampling(session: ClientSession, observer: Observer, **_: Any) -> dict[str, Any]:
    out = await run_task_to_result(session, "summarize", {"passage": "A long text about tasks."})
    out["samplings"] = observer.samplings[-1:]
    return out


async def scenario_failure(session: ClientSession, **_: Any) -> dict[str, Any]:
    out = await run_task_to_result(session, "failing_job", {})
    created = await session.experimental.call_tool_as_task("protocol_error_job", {})
    statuses = await poll(session, created.task.taskId)
    try:
        await session.experimental.get_task_result(created.task.taskId, types.CallToolResult)
        out["protocol_error"] = {"statuses": statuses, "error": None}
    except McpError as exc:
        out["protocol_error"] = {"statuses": statuses, "error": {"code": exc.error.code, "message": exc.error.message}}
    return out


async def scenario_cancel(session: ClientSession, **_: Any) -> dict[str, Any]:
    created = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 60, "label": "sdk-cancel"})
    task_id = created.task.taskId
    cancelled = await session.experimental.cancel_task(task_id)
    after = await session.experimental.get_task(task_id)
    try:
        await session.experimental.cancel_task(task_id)
        again: dict[str, Any] | None = None
    except McpError as exc:
        again = {"code": exc.error.code, "message": exc.error.message}
    return {"task_id": task_id, "cancelled": dump(cancelled), "after": dump(after), "cancel_again": again}


async def scenario_list(session: ClientSession, **_: Any) -> dict[str, Any]:
    created = []
    for i in range(3):
        result = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 0, "label": f"list-{i}"})
        created.append(result.task.taskId)
    listed: list[str] = []
    pages = 0
    cursor = None
    while True:
        page = await session.experimental.list_tasks(cursor)
        pages += 1
        listed.extend(task.taskId for task in page.tasks)
        cursor = page.nextCursor
        if not cursor:
            break
    try:
        await session.experimental.list_tasks("not-a-cursor")
        bad_cursor = None
    except McpError as exc:
        bad_cursor = exc.error.code
    return {"created": created, "listed": listed, "pages": pages, "bad_cursor": bad_cursor}


async def scenario_peek(session: ClientSession, task_id: str | None = None, **_: Any) -> dict[str, Any]:
    """What this identity sees of someone else's task: its list, and the task by id."""
    listed = [task.taskId for task in (await session.experimental.list_tasks()).tasks]
    errors = {}
    for name, call in (
        ("get", session.experimental.get_task),
        ("cancel", session.experimental.cancel_task),
        ("result", lambda tid: session.experimental.get_task_result(tid, types.CallToolResult)),
    ):
        try:
            await call(task_id)
            errors[name] = None
        except McpError as exc:
            errors[name] = exc.error.code
    return {"listed": listed, "errors": errors}


async def scenario_notifications(session: ClientSession, observer: Observer, **_: Any) -> dict[str, Any]:
    created = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 0.3, "label": "notify"})
    task_id = created.task.taskId
    await poll(session, task_id)
    with anyio.move_on_after(5):
        while not any(
            n.get("method") == "notifications/tasks/status"
            and n["params"]["taskId"] == task_id
            and n["params"]["status"] == "completed"
            for n in observer.notifications
        ):
            await anyio.sleep(0.05)
    seen = [n["params"] for n in observer.notifications if n.get("method") == "notifications/tasks/status"]
    return {"task_id": task_id, "statuses": [n["status"] for n in seen if n["taskId"] == task_id], "params": seen}


async def scenario_plain(session: ClientSession, observer: Observer, **_: Any) -> dict[str, Any]:
    """Tool calls without a task: the server asks the client on the POST's own stream."""
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    elicited = await session.call_tool("test_elicitation", {"message": "Who are you?"})
    sampled = await session.call_tool("test_sampling", {"prompt": "Say something"})
    await session.set_logging_level("info")
    logged = await session.call_tool("test_tool_with_logging", {})
    progressed = await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
    await anyio.sleep(0.2)
    return {
        "elicitation": texts(elicited),
        "sampling": texts(sampled),
        "logging": texts(logged),
        "logs": [entry["data"] for entry in observer.logs],
        "progress": progress,
        "progress_text": texts(progressed),
    }


SCENARIOS = {
    "capabilities": scenario_capabilities,
    "complete": scenario_complete,
    "elicitation": scenario_elicitation,
    "sampling": scenario_sampling,
    "failure": scenario_failure,
    "cancel": scenario_cancel,
    "list": scenario_list,
    "peek": scenario_peek,
    "notifications": scenario_notifications,
    "plain": scenario_plain,
}


async def main(url: str, scenarios: list[str], token: str | None, task_id: str | None) -> dict[str, Any]:
    observer = Observer()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out: dict[str, Any] = {}
    timeout = httpx.Timeout(30, read=120)
    async with (
        httpx.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as (read, write, get_session_id),
        ClientSession(
            read,
            write,
            elicitation_callback=observer.elicit,
            sampling_callback=observer.sample,
            message_handler=observer.message,
            logging_callback=observer.log,
        ) as session,
    ):
        init = await session.initialize()
        out["session_id"] = get_session_id()
        for name in scenarios:
            try:
                with anyio.fail_after(60):
                    out[name] = await SCENARIOS[name](session=session, observer=observer, init=init, task_id=task_id)
            except Exception as exc:
                out[name] = {"exception": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--token")
    parser.add_argument("--task-id")
    args = parser.parse_args()
    result = anyio.run(main, args.url, args.scenarios, args.token, args.task_id)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
