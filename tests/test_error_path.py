"""The endpoint's one error path, in both eras: an outage of the task store
is a JSON-RPC error with HTTP 503, a bug one with HTTP 500, never an HTML
page. The fault is raised by a handler, as the ORM would raise it. The
error carries the id of the request whenever the request had a valid one."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError

from mcptasks.protocol.legacy import handlers as legacy
from mcptasks.protocol.legacy import sessions as legacy_sessions
from mcptasks.protocol.modern import handlers as modern
from tests.support.legacy import DjangoLegacy
from tests.support.rpc import DjangoRpc

pytestmark = pytest.mark.django_db(transaction=True)

STORE_UNAVAILABLE = "Internal error: the task store is unavailable; retry later"

FAULTS = [
    pytest.param(DatabaseError("server closed the connection"), 503, STORE_UNAVAILABLE, id="outage"),
    pytest.param(RuntimeError("a bug"), 500, "Internal error", id="bug"),
]


def failing(fault: Exception) -> Any:
    def handler(*args: Any, **kwargs: Any) -> Any:
        raise fault

    return handler


def assert_internal_error(reply: Any, status: int, message: str, request_id: Any) -> None:
    assert reply.status == status, reply
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.body == {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": message}}


@pytest.mark.parametrize(("fault", "status", "message"), FAULTS)
def test_a_legacy_request(client, monkeypatch, fault, status, message):
    session = DjangoLegacy(client, validate=False)
    session.initialize()
    monkeypatch.setitem(legacy.HANDLERS, "tools/list", failing(fault))
    reply = session.request("tools/list")
    assert_internal_error(reply, status, message, reply.request["id"])


@pytest.mark.parametrize(("fault", "status", "message"), FAULTS)
def test_a_legacy_session_request(client, monkeypatch, fault, status, message):
    session = DjangoLegacy(client, validate=False)
    session.initialize()
    monkeypatch.setattr(legacy_sessions, "close_session", failing(fault))
    reply = session.delete()
    assert reply.status == status, reply
    assert reply.body == {"jsonrpc": "2.0", "error": {"code": -32603, "message": message}}


@pytest.mark.parametrize(("fault", "status", "message"), FAULTS)
def test_a_modern_request(client, monkeypatch, fault, status, message):
    rpc = DjangoRpc(client, validate=False)
    monkeypatch.setitem(modern.HANDLERS, "tools/list", failing(fault))
    reply = rpc.request("tools/list", request_id=7)
    assert_internal_error(reply, status, message, 7)
