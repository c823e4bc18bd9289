"""The official Python SDK client (``mcp`` 2.3.0) against the live stack.

The SDK negotiates 2026-07-28 through server/discover, builds every request
itself (``_meta``, routing headers), drives MRTR rounds through its
elicitation callback, and resolves task handles through our client extension
(tests/support/sdk_tasks.py).
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support import postgres_only
from tests.support.sdk_tasks import TASKS_EXT, TasksExtension, cancel_task, get_task

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]


def run(coro_fn, *args: Any) -> Any:
    return anyio.run(coro_fn, *args)


def texts(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


def test_sdk_negotiates_the_modern_wire_and_sees_the_extension(live_stack):
    async def main() -> None:
        async with Client(live_stack.url, extensions=[TasksExtension()]) as client:
            assert client.protocol_version == "2026-07-28"
            assert TASKS_EXT in (client.server_capabilities.extensions or {})
            tools = await client.list_tools()
            names = {t.name for t in tools.tools}
            assert {"greet", "slow_compute", "confirm_delete", "test_tool_with_task"} <= names
            greeting = await client.call_tool("greet", {"name": "SDK"})
            assert texts(greeting) == "Hello, SDK!"
            assert greeting.result_type == "complete"

    run(main)


def test_sdk_resolves_a_task_handle(live_stack):
    tasks = TasksExtension()

    async def main() -> None:
        async with Client(live_stack.url, extensions=[tasks]) as client:
            result = await client.call_tool("slow_compute", {"seconds": 0.5, "label": "via-sdk"})
            assert not result.is_error
            assert "via-sdk" in texts(result)

    run(main)
    assert len(tasks.created) == 1
    assert tasks.created[0].status == "working"
    assert tasks.seen[-1].status == "completed"
    assert {t.task_id for t in tasks.seen} == {tasks.created[0].task_id}


def test_sdk_mrtr_rounds_then_a_task(live_stack):
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Alice"})

    tasks = TasksExtension()

    async def main() -> None:
        async with Client(live_stack.url, extensions=[tasks], elicitation_callback=on_elicit) as client:
            result = await client.call_tool("test_tool_with_task", {})
            assert "Alice" in texts(result)

    run(main)
    assert len(asked) == 1, "one MRTR round before the task"
    assert len(tasks.created) == 1


def test_sdk_task_elicitation_through_tasks_update(live_stack):
    def answer(key: str, request: dict[str, Any]) -> dict[str, Any]:
        assert request["method"] == "elicitation/create"
        return {"action": "accept", "content": {"confirm": True}}

    tasks = TasksExtension(answer=answer)

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("a task's questions come through tasks/get, not MRTR")

    async def main() -> None:
        async with Client(live_stack.url, extensions=[tasks], elicitation_callback=on_elicit) as client:
            result = await client.call_tool("confirm_delete", {"filename": "sdk.txt"})
            assert "sdk.txt" in texts(result)

    run(main)
    assert "input_required" in [t.status for t in tasks.seen]


def test_sdk_tool_error_and_protocol_error(live_stack):
    async def main() -> None:
        async with Client(live_stack.url, extensions=[TasksExtension()]) as client:
            tool_error = await client.call_tool("failing_job", {})
            assert tool_error.is_error is True
            with pytest.raises(MCPError) as info:
                await client.call_tool("protocol_error_job", {})
            assert info.value.code == -32603

    run(main)


def test_sdk_without_the_extension_gets_32021_for_a_required_task_tool(live_stack):
    async def main() -> None:
        async with Client(live_stack.url) as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("failing_job", {})
            assert info.value.code == -32021
            assert info.value.data["requiredCapabilities"]["extensions"][TASKS_EXT] == {}
            inline = await client.call_tool("slow_compute", {"seconds": 0, "label": "inline"})
            assert "inline" in texts(inline)

    run(main)


def test_sdk_cancel(live_stack):
    async def main() -> None:
        async with Client(live_stack.url, extensions=[TasksExtension()]) as client:
            created = await client.session.call_tool(
                "slow_compute", {"seconds": 60, "label": "sdk-cancel"}, allow_claimed=True
            )
            assert created.result_type == "task"
            ack = await cancel_task(client.session, created.task_id)
            assert ack.result_type == "complete"
            with anyio.fail_after(5):
                while (await get_task(client.session, created.task_id)).status != "cancelled":
                    await anyio.sleep(0.05)
            again = await cancel_task(client.session, created.task_id)
            assert again.result_type == "complete"

    run(main)
