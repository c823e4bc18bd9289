"""The request limits on a live server (uvicorn in front): a body announced
over the limit, a foreign Host header, the poll throttle and the listen rate.
The in-process side of the same limits is tests/test_limits.py."""

from __future__ import annotations

import json

import pytest

from tests.support import postgres_only
from tests.support.rpc import PROTOCOL_VERSION, TASKS_CAPS, build_headers, build_meta


@pytest.fixture(scope="module")
def limits_stack(private_services, tmp_path_factory):
    from tests.reliability.stack import running_chaos_stack

    with running_chaos_stack(
        private_services,
        tmp_path_factory.mktemp("limits"),
        workers=1,
        sweeper=False,
        settings={
            "MCP_POLL_BURST": "2",
            "MCP_POLL_INTERVAL_MS": "30000",
            "MCPTASKS_TEST_THROTTLE_RATES": json.dumps({"call": "100/s", "update": "100/s", "listen": "2/m"}),
        },
    ) as stack:
        yield stack


@pytest.mark.live
@postgres_only.CHAOS
def test_live_announced_length_over_the_limit_is_413_before_the_body(limits_stack):
    """A client announces 50 MB and sends nothing more: the server answers
    413 at once instead of waiting for (or buffering) the body."""
    import socket

    with socket.create_connection(("127.0.0.1", limits_stack.port), timeout=10) as sock:
        head = (
            "POST /mcp HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{limits_stack.port}\r\n"
            "Content-Type: application/json\r\n"
            f"MCP-Protocol-Version: {PROTOCOL_VERSION}\r\n"
            "Mcp-Method: tools/list\r\n"
            "Content-Length: 50000000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"jsonrpc":"2.0"')
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
    assert data, "no answer within 10 s: the server is waiting for (and would buffer) all 50 MB"
    status = int(data.split(b" ", 2)[1])
    assert status == 413, data[:300]


@pytest.mark.live
@postgres_only.CHAOS
@pytest.mark.parametrize("host", ["evil.example", "attacker.localhost"])
def test_live_foreign_host_is_400_with_a_json_rpc_error(limits_stack, host):
    import httpx

    params = {"_meta": build_meta(TASKS_CAPS)}
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": params}
    headers = {**build_headers("tools/list", params), "Host": host}
    response = httpx.post(limits_stack.url, json=body, headers=headers, timeout=10)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == -32600


@pytest.mark.live
@postgres_only.CHAOS
def test_live_poll_throttle_and_listen_rate(limits_stack):
    import httpx

    from tests.support.rpc import HttpRpc

    client = HttpRpc(limits_stack.url, validate=False)
    try:
        task_id = client.create_task("slow_compute", {"seconds": 120})
        statuses = [client.tasks_get(task_id).status for _ in range(4)]
        assert statuses[:2] == [200, 200], statuses
        assert 429 in statuses[2:], f"POLL_BURST=2 per 30 s window, yet polls got {statuses}"
        # subscriptions/listen at 2 a minute: two streams open, the third is refused.
        params = {"notifications": {"taskIds": [task_id]}, "_meta": build_meta(TASKS_CAPS)}
        body = {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": params}
        headers = {"Content-Type": "application/json", **build_headers("subscriptions/listen", params)}
        outcomes = []
        for _ in range(3):
            with httpx.stream("POST", limits_stack.url, json=body, headers=headers, timeout=10) as response:
                outcomes.append((response.status_code, response.headers.get("retry-after")))
        assert [status for status, _ in outcomes] == [200, 200, 429], outcomes
        assert outcomes[2][1] and 1 <= int(outcomes[2][1]) <= 60, outcomes
    finally:
        client.close()
