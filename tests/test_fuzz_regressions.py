"""Inputs the R4 fuzzer found that the server mishandled, pinned as small
tests (through Django's test client, so they run in a second).

Each is valid HTTP that a buggy or hostile client can send. None may cost a
5xx (a 500 page, or a 503 "the task store is unavailable" that blames the
database for the client's input), and each answer must be a JSON-RPC error
with the code the spec gives:

* ``NaN`` / ``Infinity`` are not JSON (RFC 8259): -32700, like any other
  unparseable body. Accepted, they reach Postgres (which refuses them in a
  ``jsonb``) or come back in an answer that is no longer JSON.
* A lone surrogate (``"\\ud800"``) is legal JSON syntax with no Unicode
  meaning: refuse it (-32700 or -32602), or carry it through, but never
  crash while encoding the answer or storing it.
* ``\\u0000`` cannot be stored in a Postgres text or ``jsonb`` value: an
  id with it names no task (-32602, exactly like an unknown id); arguments
  with it are invalid params (-32602).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.rpc import TASKS_CAPS, DjangoRpc, build_headers, build_meta

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rpc(client: Any) -> DjangoRpc:
    """A 500 comes back as a response (as a server would send it), not as the
    view's exception raised into the test."""
    client.raise_request_exception = False
    return DjangoRpc(client, validate=False)


META = json.dumps(build_meta(TASKS_CAPS))


def post(rpc: Any, method: str, params_json: str, *, request_id: str = "1", name: str | None = None) -> Any:
    """A request whose params (and id) are given as JSON text."""
    body = f'{{"jsonrpc":"2.0","id":{request_id},"method":"{method}","params":{{{params_json},"_meta":{META}}}}}'
    headers = build_headers(method, {})
    if name is not None:
        headers["Mcp-Name"] = name
    return rpc.post_raw(body.encode(), headers)


def assert_json_rpc_error(reply: Any, codes: set[int], statuses: set[int]) -> dict[str, Any]:
    assert reply.status < 500, f"a {reply.status} for the client's input: {reply.raw[:300]!r}"
    assert isinstance(reply.body, dict) and "error" in reply.body, reply.raw[:300]
    error = reply.body["error"]
    assert error["code"] in codes and reply.status in statuses, reply
    return error


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_parse_errors(rpc, constant):
    reply = post(rpc, "tools/call", f'"name":"slow_compute","arguments":{{"seconds":{constant}}}', name="slow_compute")
    assert_json_rpc_error(reply, {-32700}, {400})


def test_nan_outside_the_params_is_a_parse_error_too(rpc):
    body = f'{{"jsonrpc":"2.0","id":1,"x":NaN,"method":"tools/list","params":{{"_meta":{META}}}}}'
    reply = rpc.post_raw(body.encode(), build_headers("tools/list", {}))
    assert_json_rpc_error(reply, {-32700}, {400})


@pytest.mark.parametrize("request_id", ['"\\ud800"', '"a\\udfffb"'])
def test_a_lone_surrogate_in_the_id_is_no_crash(rpc, request_id):
    reply = post(rpc, "no/such/method", '"x":1', request_id=request_id)
    assert reply.status < 500, reply.raw[:300]
    assert isinstance(reply.body, dict) and "error" in reply.body, reply.raw[:300]


def test_a_lone_surrogate_in_task_arguments_is_no_crash(rpc):
    reply = post(
        rpc, "tools/call", '"name":"slow_compute","arguments":{"seconds":0,"label":"\\ud800"}', name="slow_compute"
    )
    assert reply.status < 500, reply.raw[:300]
    if "error" in (reply.body or {}):
        assert reply.body["error"]["code"] in (-32700, -32602), reply


def test_nul_in_a_task_id_is_an_unknown_task(rpc):
    nul = post(rpc, "tasks/get", '"taskId":"a\\u0000b"')
    unknown = post(rpc, "tasks/get", '"taskId":"a0b"')
    assert_json_rpc_error(nul, {-32602}, {200})
    assert nul.body == unknown.body, "the same answer as for any unknown id"


def test_nul_in_task_arguments_is_invalid_params(rpc):
    reply = post(
        rpc, "tools/call", '"name":"slow_compute","arguments":{"seconds":0,"label":"a\\u0000b"}', name="slow_compute"
    )
    assert_json_rpc_error(reply, {-32602}, {200})
