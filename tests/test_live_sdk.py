"""The official Python SDK client (``mcp`` 2.3.0) against the live stack.

The SDK negotiates 2026-07-28 through server/discover, builds every request
itself (``_meta``, routing headers), drives MRTR rounds through its
elicitation callback, and resolves task handles through mcptasks' own client,
``mcptasks.client``: polling or listening, answering by key, cancelling.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcptasks.client import (
    TASKS_EXTENSION,
    CreateTaskResult,
    DetailedTask,
    TaskCancelledError,
    TaskFailedError,
    TaskInputRequiredError,
    TasksExtension,
    cancel_task,
    get_task,
    update_task,
    wait_for_task,
)
from tests.support import postgres_only

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]


def run(coro_fn, *args: Any) -> Any:
    return anyio.run(coro_fn, *args)


def texts(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


def test_sdk_negotiates_the_modern_wire_and_sees_the_extension(live_stack):
    async def main() -> None:
        async with Client(live_stack.url, extensions=[TasksExtension()]) as client:
            assert client.protocol_version == "2026-07-28"
            assert TASKS_EXTENSION in (client.server_capabilities.extensions or {})
            tools = await client.list_tools()
            names = {t.name for t in tools.tools}
            assert {"greet", "slow_compute", "confirm_delete", "test_tool_with_task"} <= names
            greeting = await client.call_tool("greet", {"name": "SDK"})
            assert texts(greeting) == "Hello, SDK!"
            assert greeting.result_type == "complete"

    run(main)


async def never_asked(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("a task's questions come through tasks/get, not MRTR")


class Seen:
    """What the extension saw: each handle, each state."""

    def __init__(self) -> None:
        self.created: list[CreateTaskResult] = []
        self.states: list[DetailedTask] = []

    def extension(self, **options: Any) -> TasksExtension:
        return TasksExtension(on_created=self.created.append, on_status=self.states.append, **options)


@pytest.mark.parametrize("listen", [False, True], ids=["poll", "listen"])
def test_sdk_resolves_a_task_handle(live_stack, listen):
    seen = Seen()

    async def main() -> None:
        async with Client(live_stack.url, extensions=[seen.extension(listen=listen, timeout=30)]) as client:
            result = await client.call_tool("slow_compute", {"seconds": 0.5, "label": "via-sdk"})
            assert not result.is_error
            assert "via-sdk" in texts(result)

    run(main)
    assert len(seen.created) == 1
    assert seen.created[0].status == "working"
    assert seen.states[-1].status == "completed"
    assert {t.task_id for t in seen.states} == {seen.created[0].task_id}
    if listen:
        # Woken by notifications/tasks, not by tasks/get at the server's interval:
        # the safety poll (30 s) never came, yet the 0.5 s task was followed to its end.
        assert seen.states[-1].result is not None


def test_sdk_listening_follows_a_task_without_polling_it(live_stack):
    """With listen=True and no safety poll within the test, the only tasks/get is
    the first one: the end comes as a notification."""
    seen = Seen()

    async def main() -> float:
        extension = seen.extension(listen=True, timeout=20, safety_poll_seconds=600)
        async with Client(live_stack.url, extensions=[extension]) as client:
            started = anyio.current_time()
            await client.call_tool("slow_compute", {"seconds": 1.5, "label": "listened"})
            return anyio.current_time() - started

    took = run(main)
    assert took < 15, "the end arrived as a notification, long before the safety poll"
    assert seen.states[0].status == "working" and seen.states[-1].status == "completed"


def test_sdk_mrtr_rounds_then_a_task(live_stack):
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Alice"})

    seen = Seen()

    async def main() -> None:
        async with Client(live_stack.url, extensions=[seen.extension()], elicitation_callback=on_elicit) as client:
            result = await client.call_tool("test_tool_with_task", {})
            assert "Alice" in texts(result)

    run(main)
    assert len(asked) == 1, "one MRTR round before the task"
    assert len(seen.created) == 1


@pytest.mark.parametrize("listen", [False, True], ids=["poll", "listen"])
def test_sdk_task_elicitation_through_tasks_update(live_stack, listen):
    asked: list[tuple[str, str]] = []

    async def on_input(key: str, request: dict[str, Any]) -> dict[str, Any]:
        asked.append((key, request["method"]))
        return {"action": "accept", "content": {"confirm": True}}

    seen = Seen()

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("a task's questions come through tasks/get, not MRTR")

    async def main() -> None:
        extension = seen.extension(on_input=on_input, listen=listen, timeout=30)
        async with Client(live_stack.url, extensions=[extension], elicitation_callback=on_elicit) as client:
            result = await client.call_tool("confirm_delete", {"filename": "sdk.txt"})
            assert texts(result) == "Deleted sdk.txt"

    run(main)
    assert asked == [("confirm", "elicitation/create")], "asked once, keyed as the task asked"
    assert "input_required" in [t.status for t in seen.states]


def test_sdk_two_questions_answered_by_key(live_stack):
    def on_input(key: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"action": "accept", "content": {"name": key.upper()}}

    async def main() -> str:
        # The SDK declares elicitation only for a client with an elicitation callback.
        tasks = TasksExtension(on_input=on_input, timeout=30)
        async with Client(live_stack.url, extensions=[tasks], elicitation_callback=never_asked) as client:
            return texts(await client.call_tool("multi_input", {}))

    assert run(main) == "Got FIRST and SECOND."


def test_sdk_a_question_without_an_answerer_raises_and_can_be_answered_later(live_stack):
    async def main() -> str:
        async with Client(
            live_stack.url, extensions=[TasksExtension(timeout=30)], elicitation_callback=never_asked
        ) as client:
            with pytest.raises(TaskInputRequiredError) as info:
                await client.call_tool("confirm_delete", {"filename": "later.txt"})
            task = info.value.task
            assert set(task.input_requests or {}) == {"confirm"}
            await update_task(client.session, task.task_id, {"confirm": {"action": "decline"}})
            return texts(await wait_for_task(client.session, task.task_id, timeout=30))

    assert run(main) == "Kept later.txt"


def test_sdk_tool_error_and_protocol_error(live_stack):
    async def main() -> None:
        async with Client(live_stack.url, extensions=[TasksExtension()]) as client:
            tool_error = await client.call_tool("failing_job", {})
            assert tool_error.is_error is True
            with pytest.raises(TaskFailedError) as info:
                await client.call_tool("protocol_error_job", {})
            assert info.value.code == -32603
            assert info.value.message == "Simulated protocol error during execution"
            assert isinstance(info.value, MCPError)

    run(main)


def test_sdk_without_the_extension_gets_32021_for_a_required_task_tool(live_stack):
    async def main() -> None:
        async with Client(live_stack.url) as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("failing_job", {})
            assert info.value.code == -32021
            assert info.value.data["requiredCapabilities"]["extensions"][TASKS_EXTENSION] == {}
            inline = await client.call_tool("slow_compute", {"seconds": 0, "label": "inline"})
            assert "inline" in texts(inline)

    run(main)


def test_sdk_cancel(live_stack):
    async def main() -> None:
        async with Client(live_stack.url, extensions=[TasksExtension()]) as client:
            created = await client.session.call_tool(
                "slow_compute", {"seconds": 60, "label": "sdk-cancel"}, allow_claimed=True
            )
            assert isinstance(created, CreateTaskResult) and created.result_type == "task"
            await cancel_task(client.session, created.task_id)
            with anyio.fail_after(5):
                while (await get_task(client.session, created.task_id)).status != "cancelled":
                    await anyio.sleep(0.05)
            await cancel_task(client.session, created.task_id)  # acknowledged again
            with pytest.raises(TaskCancelledError) as info:
                await wait_for_task(client.session, created.task_id)
            assert info.value.task_id == created.task_id

    run(main)


def test_sdk_a_call_given_up_cancels_its_task(live_stack):
    """A call that times out, or whose caller cancels it, cancels its task on the server."""
    seen = Seen()

    async def main() -> list[str]:
        async with Client(live_stack.url, extensions=[seen.extension(timeout=1.5)]) as client:
            with pytest.raises(TimeoutError):
                await client.call_tool("slow_compute", {"seconds": 60, "label": "timed-out"})
            with anyio.move_on_after(1.5) as scope:
                await client.call_tool("slow_compute", {"seconds": 60, "label": "abandoned"})
            assert scope.cancelled_caught
            ends = []
            for created in seen.created:
                with anyio.fail_after(10):
                    while (status := (await get_task(client.session, created.task_id)).status) == "working":
                        await anyio.sleep(0.05)
                ends.append(status)
            return ends

    assert run(main) == ["cancelled", "cancelled"]
