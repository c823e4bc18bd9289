"""A task belongs to its creator. Another identity learns nothing about it:
for every task method it gets exactly what it gets for an id that does not
exist (same HTTP status, code, message and data), and changes nothing."""

from __future__ import annotations

import secrets

import pytest

from tests.support import postgres_only
from tests.support.rpc import HttpRpc

pytestmark = [pytest.mark.live, postgres_only.LIVE_STACK]


@pytest.fixture(scope="module")
def tokens(live_stack) -> dict[str, str]:
    code = (
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from rest_framework.authtoken.models import Token\n"
        "keys = {}\n"
        "for name in ('alice', 'bob'):\n"
        "    user, _ = get_user_model().objects.get_or_create(username='isolation-' + name)\n"
        "    keys[name] = Token.objects.get_or_create(user=user)[0].key\n"
        "print(json.dumps(keys))\n"
    )
    return live_stack.shell(code)


@pytest.fixture
def clients(live_stack, tokens):
    made = {name: HttpRpc(live_stack.url, token=token) for name, token in tokens.items()}
    made["anonymous"] = HttpRpc(live_stack.url)
    yield made
    for client in made.values():
        client.close()


def comparable(reply) -> tuple:
    body = {k: v for k, v in reply.body.items() if k != "id"}
    return reply.status, body


PROBES = [
    ("tasks/get", {}),
    ("tasks/update", {"inputResponses": {"confirm": {"action": "accept", "content": {"confirm": True}}}}),
    ("tasks/cancel", {}),
]


@pytest.mark.parametrize("stranger", ["bob", "anonymous"])
def test_someone_elses_task_is_indistinguishable_from_an_unknown_id(clients, live_stack, stranger):
    alice, other = clients["alice"], clients[stranger]
    task_id = alice.create_task("confirm_delete", {"filename": f"secret-{stranger}.txt"})
    alice.wait_for(task_id, {"input_required"}, timeout=10)
    unknown = secrets.token_urlsafe(24)
    assert live_stack.task_row(unknown) is None
    for method, extra in PROBES:
        theirs = other.request(method, {"taskId": task_id, **extra})
        missing = other.request(method, {"taskId": unknown, **extra})
        assert theirs.error["code"] == -32602, theirs
        assert comparable(theirs) == comparable(missing), f"{method} leaks the task's existence"
        assert theirs.headers.get("content-type") == missing.headers.get("content-type")
    # Nothing the stranger sent reached the task.
    row = live_stack.task_row(task_id)
    assert row["status"] == "input_required"
    assert live_stack.query("SELECT key, state FROM mcptasks_inputrequest WHERE task_id = %s", (task_id,)) == [
        {"key": "confirm", "state": "pending"}
    ]
    events = {e["kind"] for e in live_stack.events(task_id)}
    assert "input" not in events and "cancel_requested" not in events
    # The owner still has it, and finishes it.
    assert alice.tasks_get(task_id).result["status"] == "input_required"
    alice.tasks_update(task_id, {"confirm": {"action": "accept", "content": {"confirm": True}}})
    assert alice.wait_for(task_id)["status"] == "completed"


def test_owners_are_recorded_per_identity(clients, live_stack):
    ids = {name: client.create_task("slow_compute", {"seconds": 0, "label": name}) for name, client in clients.items()}
    owners = {name: live_stack.task_row(task_id)["owner"] for name, task_id in ids.items()}
    assert len(set(owners.values())) == 3
    assert owners["anonymous"] == "anonymous"
    assert owners["alice"].startswith("user:") and owners["bob"].startswith("user:")
    for name, client in clients.items():
        for other, task_id in ids.items():
            reply = client.tasks_get(task_id)
            if name == other:
                assert reply.result["taskId"] == task_id
            else:
                assert reply.error["code"] == -32602


def test_a_bad_token_is_refused(live_stack):
    client = HttpRpc(live_stack.url, token="definitely-not-a-token")
    try:
        reply = client.request("server/discover")
        assert reply.status == 401
        assert reply.headers.get("www-authenticate", "").startswith("Bearer")
    finally:
        client.close()
