"""A client hang-up cancels its 2026-07-28 request; the per-caller cap on
inline runs (``MAX_INLINE_RUNS_PER_OWNER``).

In-process, through both ASGI handlers that can serve the endpoint
(``mcp_router``'s and Django's own, for sites that mount ``mcptasks.urls``),
with an ASGI ``receive`` that reports the disconnect when the test says.
The live hang-up tests, against a real server and a saturated inline pool,
are in ``test_live_hangup.py``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.core.asgi import get_asgi_application

from mcptasks.models import Task, TaskStatus
from mcptasks.protocol import inline_runs
from mcptasks.web.asgi import mcp_router
from tests.support.asgi import apost, http_scope
from tests.support.rpc import NO_CAPS, TASKS_CAPS, build_headers, build_meta
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ANON = "anonymous"
TRACE = "tests.testapp"


@pytest.fixture(autouse=True)
def no_runs_left_behind() -> Iterator[None]:
    """Every test starts with no inline run counted, and must leave none."""
    gc.collect()  # a stream another test left unread frees its run when collected
    assert inline_runs.inline_runs(ANON) == 0
    yield
    wait_until(lambda: inline_runs.inline_runs(ANON) == 0, 10, what="every inline run released")


def request_body(name: str, arguments: Mapping[str, Any], caps: Mapping[str, Any], **meta: Any) -> tuple[bytes, dict]:
    params = {"name": name, "arguments": dict(arguments), "_meta": {**build_meta(caps), **meta}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
    headers = {k: v for k, v in build_headers("tools/call", params).items() if k.lower() != "content-type"}
    return body, headers


async def hang_up(app: Any, body: bytes, headers: Mapping[str, str], after: float) -> list[dict[str, Any]]:
    """Send one request to ``app``, disconnect ``after`` seconds later; what
    the server sent, once it is done with the request."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(after)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    before = asyncio.all_tasks()
    await app(http_scope(body, headers), receive, send)
    # A server's loop outlives the request: what the request left running
    # (a thread's work the hang-up did not stop) ends before this loop does.
    left = asyncio.all_tasks() - before
    if left:
        await asyncio.wait(left, timeout=30)
    return sent


def handlers() -> dict[str, Any]:
    django_app = get_asgi_application()
    return {"mcp_router": mcp_router(django_app, path="/mcp"), "django": django_app}


def traces(caplog: pytest.LogCaptureFixture, label: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == TRACE and f" {label}: cancelled" in r.getMessage()]


# A hang-up cancels the run ----------------------------------------------------------------


@pytest.mark.parametrize("handler", ["mcp_router", "django"])
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
def test_a_hang_up_cancels_the_inline_run(handler, streamed, caplog):
    caplog.set_level(logging.WARNING, logger=TRACE)
    label = f"{handler}-{streamed}"
    extra = {"progressToken": "p1"} if streamed else {}
    body, headers = request_body("sleep_inline", {"seconds": 30, "label": label}, NO_CAPS, **extra)
    started = time.monotonic()
    sent = asyncio.run(hang_up(handlers()[handler], body, headers, after=0.5))
    assert time.monotonic() - started < 10, "the request ended with the hang-up"
    wait_until(lambda: traces(caplog, label), 10, what="the tool saw the cancel")
    assert float(traces(caplog, label)[0].rsplit(" ", 1)[-1].rstrip("s")) < 10
    if not streamed:
        assert sent == [], "nothing is sent to a client that hung up"
    else:  # the stream's head went out before the hang-up; no result after it
        assert b'"result"' not in b"".join(m.get("body", b"") for m in sent)


def test_a_hang_up_cancels_an_mrtr_round(caplog):
    """A prompt (or tool) run answering an earlier round is an inline run like any other."""
    caplog.set_level(logging.WARNING, logger=TRACE)
    body, headers = request_body("sleep_inline", {"seconds": 30, "label": "mrtr"}, NO_CAPS)
    data = json.loads(body)
    data["params"]["inputResponses"] = {}
    body = json.dumps(data).encode()
    asyncio.run(hang_up(handlers()["mcp_router"], body, headers, after=0.3))
    wait_until(lambda: traces(caplog, "mrtr"), 10, what="the tool saw the cancel")


def test_a_run_queued_behind_a_full_pool_never_starts_once_its_client_is_gone(settings, caplog):
    """Abandoned runs waiting for a tool thread are dropped, not run for nobody."""
    caplog.set_level(logging.WARNING, logger=TRACE)
    settings.MCPTASKS = {**settings.MCPTASKS, "INLINE_TOOL_THREADS": 1, "MAX_INLINE_RUNS_PER_OWNER": None}
    from mcptasks import threads

    threads._pools.pop("tools", None)  # a pool of one thread for this test
    try:
        app = handlers()["mcp_router"]
        first = request_body("sleep_inline", {"seconds": 30, "label": "holder"}, NO_CAPS)
        queued = request_body("sleep_inline", {"seconds": 30, "label": "queued"}, NO_CAPS)

        async def both() -> None:
            holder = asyncio.ensure_future(hang_up(app, *first, after=1.5))
            await asyncio.sleep(0.5)  # the holder has the one thread
            await asyncio.gather(holder, hang_up(app, *queued, after=0.3))

        asyncio.run(both())
        wait_until(lambda: traces(caplog, "holder"), 10, what="the running tool saw the cancel")
        assert traces(caplog, "queued") == [], "the queued run never started"
    finally:
        threads._pools.pop("tools", None)


def test_a_hang_up_within_the_auto_budget_cancels_the_task(settings):
    """An ``auto`` tool's client that leaves before the budget never learns of
    the task: it is cancelled, as the inline run it stood for would be."""
    settings.MCPTASKS = {**settings.MCPTASKS, "AUTO_TASK_BUDGET_SECONDS": 20.0}
    body, headers = request_body("maybe_slow", {"seconds": 30}, TASKS_CAPS)
    started = time.monotonic()
    sent = asyncio.run(hang_up(handlers()["mcp_router"], body, headers, after=0.5))
    assert time.monotonic() - started < 10, "the budget's wait ended with the hang-up"
    assert sent == []
    wait_until(
        lambda: Task.objects.filter(tool_name="maybe_slow", status=TaskStatus.CANCELLED).exists(),
        10,
        what="the auto task cancelled",
    )


def test_a_task_outlives_the_connection_that_created_it():
    """A call answered with a task is not cancelled by its client leaving,
    even at once, before the answer could reach it."""
    body, headers = request_body("slow_compute", {"seconds": 30}, TASKS_CAPS)
    asyncio.run(hang_up(handlers()["mcp_router"], body, headers, after=0.0))
    wait_until(lambda: Task.objects.filter(tool_name="slow_compute").exists(), 10, what="the task created")
    time.sleep(0.5)
    task = Task.objects.get(tool_name="slow_compute")
    assert task.status == TaskStatus.WORKING, task.status
    assert task.cancelled_by in ("", None)


# MAX_INLINE_RUNS_PER_OWNER --------------------------------------------------------------------


async def call(app: Any, body: bytes, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
    return await apost(app, body, headers)


def test_inline_runs_past_the_cap_are_429(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_INLINE_RUNS_PER_OWNER": 2}
    app = handlers()["mcp_router"]
    slow = request_body("sleep_inline", {"seconds": 1.5}, NO_CAPS)

    async def three() -> list[tuple[int, dict[str, str], bytes]]:
        return list(await asyncio.gather(call(app, *slow), call(app, *slow), call(app, *slow)))

    replies = asyncio.run(three())
    statuses = sorted(status for status, _, _ in replies)
    assert statuses == [200, 200, 429], statuses
    status, headers, raw = next(r for r in replies if r[0] == 429)
    error = json.loads(raw)["error"]
    assert error["code"] == -31000 and "inline" in error["message"]
    assert error["data"]["retryAfterMs"] == 1000
    assert headers["retry-after"] == "1"
    # Once they ended, the caller is served again.
    status, _, _ = asyncio.run(call(app, *request_body("greet", {"name": "a"}, NO_CAPS)))
    assert status == 200


def test_the_cap_is_per_caller(settings, token_for):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_INLINE_RUNS_PER_OWNER": 1}
    token = token_for("cap-bob")
    app = handlers()["mcp_router"]
    slow = request_body("sleep_inline", {"seconds": 1.5}, NO_CAPS)
    body, headers = request_body("greet", {"name": "b"}, NO_CAPS)

    async def both() -> list[tuple[int, dict[str, str], bytes]]:
        held = asyncio.ensure_future(call(app, *slow))
        await asyncio.sleep(0.5)
        others = await asyncio.gather(
            call(app, body, headers), call(app, body, {**headers, "Authorization": f"Token {token}"})
        )
        return [*others, await held]

    mine, bobs, held = asyncio.run(both())
    assert mine[0] == 429, "the anonymous caller is at its cap"
    assert bobs[0] == 200, "another caller has its own"
    assert held[0] == 200


def test_streamed_runs_count_against_the_cap(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_INLINE_RUNS_PER_OWNER": 1}
    app = handlers()["mcp_router"]
    streamed = request_body("sleep_inline", {"seconds": 1.5}, NO_CAPS, progressToken="p")
    plain = request_body("greet", {"name": "a"}, NO_CAPS)

    async def both() -> list[tuple[int, dict[str, str], bytes]]:
        held = asyncio.ensure_future(call(app, *streamed))
        await asyncio.sleep(0.5)
        refused = await call(app, *plain)
        return [refused, await held]

    refused, held = asyncio.run(both())
    assert refused[0] == 429
    assert held[0] == 200 and held[1]["content-type"].startswith("text/event-stream")


def test_the_cap_off(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "MAX_INLINE_RUNS_PER_OWNER": None}
    app = handlers()["mcp_router"]
    slow = request_body("sleep_inline", {"seconds": 0.5}, NO_CAPS)

    async def many() -> list[tuple[int, dict[str, str], bytes]]:
        return list(await asyncio.gather(*(call(app, *slow) for _ in range(12))))

    assert {status for status, _, _ in asyncio.run(many())} == {200}
