"""A client that hangs up cancels its request, live (2026-07-28,
"Transport-Specific Cancellation": the server MUST treat a client disconnect
as cancellation of that request).

The issue's repro: callers start slow inline runs and leave after a second.
Whether the answer would have been plain JSON or an SSE stream, the tool must
see the cancel (``sleep_inline`` logs it), the runs must let go of the inline
pool and of their caller's inline slots, and the next caller must be answered
within a second.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

from mcptasks.conf import settings as mcp_settings
from tests.support import postgres_only
from tests.support.rpc import NO_CAPS, TASKS_CAPS, HttpRpc, build_headers, build_meta
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]

#: How long the abandoned runs would sleep if nobody cancelled them.
SLEEP_SECONDS = 20


def call_request(label: str, token: str | None = None, **meta: Any) -> tuple[bytes, dict[str, str]]:
    """A ``tools/call`` of ``sleep_inline`` from a client without the tasks
    extension (so it runs inline), and its headers."""
    params = {
        "name": "sleep_inline",
        "arguments": {"seconds": SLEEP_SECONDS, "label": label},
        "_meta": {**build_meta(NO_CAPS), **meta},
    }
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
    headers = build_headers("tools/call", params)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return body, headers


def send_call(port: int, body: bytes, headers: Mapping[str, str]) -> socket.socket:
    """Send one HTTP request on a connection of its own and leave it open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    lines = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def unanswered(sock: socket.socket) -> bool:
    """Nothing came back on ``sock`` yet (the call is in flight, not refused)."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # an answer, or the connection closed
        return False
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def stream_opened(sock: socket.socket) -> bool:
    """The answer's head says 200 and an SSE stream."""
    sock.settimeout(10)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head.lower()


def cancelled_labels(web_log: str, prefix: str) -> list[tuple[str, float]]:
    """The runs that logged their cancel: (label, seconds they had run)."""
    pattern = re.compile(rf"sleep_inline ({re.escape(prefix)}-\d+): cancelled after ([0-9.]+)s")
    return [(found.group(1), float(found.group(2))) for found in pattern.finditer(web_log)]


def greet_time(url: str, token: str | None = None) -> float:
    """Seconds until a ``greet`` is answered; a 429 is retried (a run of the
    caller's that is still winding down), within the same second."""
    rpc = HttpRpc(url, token=token, capabilities=NO_CAPS, timeout=60)
    try:
        started = time.monotonic()
        while True:
            reply = rpc.call_tool("greet", {"name": "next"})
            if reply.status != 429 or time.monotonic() - started > 1:
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        assert reply.ok and reply.result["content"][0]["text"] == "Hello, next!", reply
        return elapsed
    finally:
        rpc.close()


def pool_is_full(url: str, token: str) -> bool:
    """A ``greet`` gets no answer within two seconds: every inline thread is
    taken (the probe then hangs up in its turn)."""
    body, headers = call_request("probe", token)
    params = json.loads(body)["params"]
    params["name"], params["arguments"] = "greet", {"name": "probe"}
    body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}).encode()
    headers["Mcp-Name"] = "greet"
    try:
        httpx.post(url, content=body, headers=headers, timeout=2)
    except httpx.TimeoutException:
        return True
    return False


@pytest.fixture
def hang_ups() -> Iterator[list[socket.socket]]:
    """Connections a test opens; closed (hung up) at the end whatever happens."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_live_hang_up_of_plain_json_calls_frees_a_saturated_pool(live_stack, hang_ups):
    """Callers fill the whole inline pool (and queue more behind it) with
    20-second runs answered as plain JSON, then leave: every started run sees
    the cancel, and the next caller is answered at once."""
    pool = mcp_settings.INLINE_TOOL_THREADS
    per_caller = mcp_settings.MAX_INLINE_RUNS_PER_OWNER
    callers = -(-(pool + 8) // per_caller)  # enough callers, each under its cap
    tokens = live_stack.create_tokens([f"hangup-json-{n}" for n in range(callers)] + ["hangup-probe"])
    probe = tokens.pop("hangup-probe")
    keys = list(tokens.values())
    for n in range(pool + 8):
        hang_ups.append(send_call(live_stack.port, *call_request(f"json-{n}", keys[n % callers])))
    wait_until(lambda: pool_is_full(live_stack.url, probe), 60, interval=0, what="the inline pool full")
    assert all(unanswered(sock) for sock in hang_ups), "every call is in flight (none refused)"
    for sock in hang_ups:
        sock.close()

    assert greet_time(live_stack.url) < 1.0, "the next caller waits for no abandoned run"
    wait_until(
        lambda: len(cancelled_labels(live_stack.log_text("web"), "json")) >= pool,
        20,
        what="every started run saw its cancel",
        explain=lambda: live_stack.logs(),
    )
    # A queued run may still take a thread freed before its own hang-up was
    # seen (it is cancelled then too); none runs its course.
    cancelled = cancelled_labels(live_stack.log_text("web"), "json")
    assert len(cancelled) <= pool + 8 and all(ran < SLEEP_SECONDS / 2 for _, ran in cancelled), cancelled


def test_live_hang_up_of_streamed_calls_frees_the_callers_runs(live_stack, hang_ups):
    """A caller at its cap of inline runs, all answered as SSE streams
    (``progressToken``), is refused one more; once it hangs up, every run sees
    the cancel and the caller is served again within a second."""
    per_caller = mcp_settings.MAX_INLINE_RUNS_PER_OWNER
    token = live_stack.create_user_token("hangup-sse")
    for n in range(per_caller):
        hang_ups.append(send_call(live_stack.port, *call_request(f"sse-{n}", token, progressToken=f"p{n}")))
    assert all(stream_opened(sock) for sock in hang_ups)

    body, headers = call_request("sse-refused", token, progressToken="refused")
    refused = httpx.post(live_stack.url, content=body, headers=headers, timeout=30)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == -31000 and refused.headers["Retry-After"] == "1"

    for sock in hang_ups:
        sock.close()
    assert greet_time(live_stack.url, token) < 1.0, "the caller's runs ended with its hang-up"
    wait_until(
        lambda: len(cancelled_labels(live_stack.log_text("web"), "sse")) == per_caller,
        20,
        what="every streamed run saw its cancel",
        explain=lambda: live_stack.logs(),
    )
    assert all(ran < SLEEP_SECONDS / 2 for _, ran in cancelled_labels(live_stack.log_text("web"), "sse"))


def test_live_a_task_outlives_the_connection_that_created_it(live_stack):
    """A client that declared the tasks extension and left at once, before
    its answer: the task it created is not cancelled and runs to the end."""
    body, headers = call_request("outlives")
    params = json.loads(body)["params"]
    params["name"], params["arguments"] = "slow_compute", {"seconds": 1, "label": "outlives-the-call"}
    params["_meta"] = build_meta(TASKS_CAPS)
    body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}).encode()
    headers["Mcp-Name"] = "slow_compute"
    send_call(live_stack.port, body, headers).close()

    def status() -> str | None:
        rows = live_stack.query(
            "SELECT status FROM mcptasks_task WHERE tool_name = 'slow_compute' AND arguments->>'label' = %s",
            ("outlives-the-call",),
        )
        return rows[0]["status"] if rows else None

    wait_until(lambda: status() in ("completed", "failed", "cancelled"), 60, what="the task finished")
    assert status() == "completed"
