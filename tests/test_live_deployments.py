"""Smoke tests of the deployment shapes beside the main stack: the test site on
MariaDB (the ORM backend), with RabbitMQ as its broker, and on Postgres behind
PgBouncer in transaction mode (``PREPARE_STATEMENTS`` and the poll snapshot
off). Each shape passes the tasks-* conformance scenarios, the official SDK's
task flows and a 2025-11-25 task's round trip, and holds a tool's concurrency
limit across two worker processes (the database decides).

They run in a pass of their own (``bin/test`` runs ``pytest -m deployments``
after the main pass): a run whose ``-m`` does not name ``deployments`` leaves
them out (conftest.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from mcptasks.client import DetailedTask, TasksExtension, cancel_task, get_task
from tests.support import deployments, postgres_only
from tests.support.legacy import HttpLegacy
from tests.support.rpc import HttpRpc
from tests.test_conformance import TASK_SCENARIOS, Suite, run_scenario, suite  # noqa: F401

pytestmark = [pytest.mark.live, pytest.mark.deployments, postgres_only.LIVE_STACK]


@pytest.fixture(scope="module", params=deployments.SHAPES)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    shape = request.param
    missing = deployments.unavailable(shape)
    if missing:
        pytest.fail(f"the {shape} deployment cannot run here: {missing}")
    with deployments.deployment_stack(shape, tmp_path_factory.mktemp(f"deploy-{shape}")) as stack:
        warm = HttpRpc(stack.url)
        try:
            final = warm.wait_for(warm.create_task("slow_compute", {"seconds": 0, "label": "warm-up"}), timeout=90)
            assert final["status"] == "completed", f"{final}\n{stack.logs()}"
        finally:
            warm.close()
        yield stack


@pytest.mark.parametrize("scenario", TASK_SCENARIOS)
def test_tasks_conformance(deployment: Any, suite: Suite, scenario: str, tmp_path: Path) -> None:  # noqa: F811
    url = f"http://localhost:{deployment.port}/mcp"  # the suite insists on a localhost URL
    outcome = run_scenario(suite, url, scenario, tmp_path)
    assert outcome.checks, f"{scenario}: the suite wrote no checks:\n{outcome.output}"
    assert not outcome.failures and outcome.returncode == 0, f"{outcome.describe_failures()}\n{deployment.logs()}"


def test_sdk_task_flows(deployment: Any) -> None:
    """The official SDK resolves a task handle, answers a task's question
    through tasks/update, and cancels a running task."""
    seen: list[DetailedTask] = []
    tasks = TasksExtension(
        on_input=lambda key, request: {"action": "accept", "content": {"confirm": True}},
        on_status=seen.append,
        timeout=60,
    )

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("a task's questions come through tasks/get, not MRTR")

    async def main() -> None:
        async with Client(deployment.url, extensions=[tasks], elicitation_callback=on_elicit) as client:
            done = await client.call_tool("slow_compute", {"seconds": 0.2, "label": "shape"})
            assert not done.is_error and "shape" in done.content[0].text
            deleted = await client.call_tool("confirm_delete", {"filename": "shape.txt"})
            assert "shape.txt" in deleted.content[0].text
            created = await client.session.call_tool("slow_compute", {"seconds": 60}, allow_claimed=True)
            assert created.result_type == "task"
            await cancel_task(client.session, created.task_id)
            with anyio.fail_after(10):
                while (await get_task(client.session, created.task_id)).status != "cancelled":
                    await anyio.sleep(0.05)

    anyio.run(main)
    assert "input_required" in [task.status for task in seen]


def test_a_2025_11_25_task_round_trip(deployment: Any) -> None:
    """A session's task asks a question over tasks/result, is answered, and
    completes; another is cancelled while its tasks/result waits."""
    client = HttpLegacy(deployment.url)
    client.initialize()
    try:
        task_id = client.create_task("confirm_delete", {"filename": "legacy.txt"})
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/result", "params": {"taskId": task_id}}
        with client.stream(body) as stream:
            question = stream.next()
            assert question["method"] == "elicitation/create"
            assert client.respond(question["id"], {"action": "accept", "content": {"confirm": True}}).status == 202
            final = stream.next()
        assert final["result"]["content"][0]["text"] == "Deleted legacy.txt"

        slow = client.create_task("slow_compute", {"seconds": 60})
        ended: dict[str, Any] = {}

        def wait() -> None:
            with client.stream({**body, "id": 2, "params": {"taskId": slow}}) as waiting:
                ended.update(waiting.next())

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.5)
        assert client.request("tasks/cancel", {"taskId": slow}).result["status"] == "cancelled"
        waiter.join(15)
        assert ended["id"] == 2 and ended["error"]["data"]["status"] == "cancelled", ended
    finally:
        client.close()


def test_a_concurrency_limit_holds_across_worker_processes(deployment: Any) -> None:
    """Eight runs of a tool limited to two at once, on two worker processes:
    never more than two run at any instant, and all complete."""
    client = HttpRpc(deployment.url)
    try:
        tasks = [client.create_task("limited_work", {"seconds": 0.4}) for _ in range(8)]
        for task_id in tasks:
            assert client.wait_for(task_id, timeout=120)["status"] == "completed"
    finally:
        client.close()
    spans: dict[str, list[float]] = {}
    for name in ("worker0", "worker1"):
        for line in deployment.log_text(name).splitlines():
            if "limited_work " in line and (" start " in line or " end " in line):
                task_id, _, at = line.split("limited_work ", 1)[1].split()[:3]
                spans.setdefault(task_id, []).append(float(at))
    assert all(len(spans.get(t, [])) == 2 for t in tasks), spans
    edges = sorted([(spans[t][0], 1) for t in tasks] + [(spans[t][1], -1) for t in tasks])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == deployments.CONCURRENCY, f"{most} runs at once"
