"""Every abuse limit, hit: the right JSON-RPC error with the right HTTP status.

Each limit is a setting (``MCPTASKS[...]``, changed here with
pytest-django's ``settings``; ``mcptasks.conf`` reloads on the change), so
the tests set small limits and go past them. Through Django's test client,
except what only a real server shows (a ``Content-Length`` announced but
never sent, a throttled stream): those are in tests/test_live_limits.py.

| limit                         | over it                                    |
|-------------------------------|--------------------------------------------|
| MAX_BODY_BYTES                | 413, -32600                                |
| MAX_JSON_DEPTH                | 400, -32600                                |
| MAX_ARGUMENTS_BYTES           | 200, -32602                                |
| MAX_INPUT_RESPONSES_BYTES     | 200, -32602                                |
| MAX_ACTIVE_TASKS_PER_OWNER    | 429, -31000, Retry-After                   |
| THROTTLE_RATES call/update/listen | 429, -31000, Retry-After               |
| POLL_BURST (per pollIntervalMs)   | 429, -31000, Retry-After               |
| MAX_TTL_MS                    | the TTL is clamped                         |
| Origin not allowed            | 403, -32600                                |
| Host not in ALLOWED_HOSTS     | 400, -32600                                |
| bad credentials               | 401, -32600, WWW-Authenticate              |
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches

from mcptasks.conf import settings as mcp_settings
from mcptasks.models import InputRequest, InputRequestState, Task, TaskStatus
from mcptasks.protocol.throttle_cache import throttle_cache
from mcptasks.tasks import lifecycle
from tests.support import postgres_only
from tests.support.factories import accept, running_task, waiting_task
from tests.support.rpc import TASKS_CAPS, DjangoRpc, build_headers, build_meta

pytestmark = pytest.mark.django_db(transaction=True)

ANON = "anonymous"


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    """Throttle counters live in the default cache: start and end clean."""
    caches["default"].clear()
    yield
    caches["default"].clear()


@pytest.fixture
def limit(settings) -> Any:
    """``limit(NAME=value, ...)`` sets MCPTASKS entries for this test."""

    def apply(**values: Any) -> None:
        settings.MCPTASKS = {**settings.MCPTASKS, **values}

    return apply


def assert_error(reply: Any, code: int, status: int) -> dict[str, Any]:
    assert reply.status == status, reply
    error = reply.error
    assert error["code"] == code, reply
    assert isinstance(error["message"], str) and error["message"]
    return error


def assert_rate_limited(reply: Any, *, at_most_seconds: float) -> dict[str, Any]:
    """429 with -31000, a ``Retry-After`` in whole seconds and ``retryAfterMs``."""
    error = assert_error(reply, -31000, 429)
    retry_after = reply.headers.get("Retry-After")
    assert retry_after is not None and retry_after.isdigit(), reply.headers
    assert 1 <= int(retry_after) <= math.ceil(at_most_seconds), retry_after
    retry_ms = (error.get("data") or {}).get("retryAfterMs")
    assert isinstance(retry_ms, int) and 0 < retry_ms <= at_most_seconds * 1000, error
    return error


def call_body(arguments_json: str, name: str = "greet") -> bytes:
    """A tools/call whose ``arguments`` are given as JSON text (for exact sizes)."""
    meta = json.dumps(build_meta(TASKS_CAPS))
    return (
        f'{{"jsonrpc":"2.0","id":7,"method":"tools/call",'
        f'"params":{{"name":"{name}","arguments":{arguments_json},"_meta":{meta}}}}}'
    ).encode()


def raw_call(rpc: DjangoRpc, arguments_json: str, name: str = "greet") -> Any:
    return rpc.post_raw(call_body(arguments_json, name), build_headers("tools/call", {"name": name}))


# MAX_BODY_BYTES ------------------------------------------------------------------------------


def test_body_over_the_limit_is_413(rpc, limit):
    limit(MAX_BODY_BYTES=4096)
    reply = raw_call(rpc, json.dumps({"name": "x" * 5000}))
    error = assert_error(reply, -32600, 413)
    assert "4096" in error["message"]
    assert "id" not in reply.body or reply.body["id"] is None, "the body was never read, so no id is known"


def test_body_at_the_limit_is_served(rpc, limit):
    limit(MAX_BODY_BYTES=4096)
    padding = 4096 - len(call_body(json.dumps({"name": ""})))
    arguments = json.dumps({"name": "x" * padding})
    assert len(call_body(arguments)) == 4096
    reply = raw_call(rpc, arguments)
    assert reply.status == 200, reply
    assert reply.result["content"][0]["text"].startswith("Hello, x")


def test_body_limit_off(rpc, limit):
    limit(MAX_BODY_BYTES=None)
    reply = raw_call(rpc, json.dumps({"name": "x" * 1_500_000}))
    assert reply.status == 200, reply


# MAX_JSON_DEPTH --------------------------------------------------------------------------------


def nested(depth: int) -> str:
    """A JSON array nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth


def test_nesting_over_the_limit_is_invalid_request(rpc, limit):
    limit(MAX_JSON_DEPTH=10)
    # The envelope is level 1, params 2, arguments 3: a value 8 deep inside reaches level 11.
    reply = raw_call(rpc, '{"name": "n", "x": ' + nested(8) + "}")
    error = assert_error(reply, -32600, 400)
    assert "10" in error["message"]


def test_nesting_at_the_limit_passes_the_depth_check(rpc, limit):
    limit(MAX_JSON_DEPTH=10)
    reply = raw_call(rpc, '{"name": "n", "x": ' + nested(7) + "}")
    # Past the depth check; greet refuses the extra argument or ignores it, either way not -32600.
    assert reply.status == 200, reply


def test_nesting_too_deep_for_the_parser_is_still_a_depth_error(rpc):
    """A document nested 100,000 deep is valid JSON and deeper than
    MAX_JSON_DEPTH (64): it must be refused as such (-32600), not as
    unparseable (-32700), and without exhausting the stack."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":' + nested(100_000).encode() + b"}}"
    reply = rpc.post_raw(body, build_headers("tools/list", {}))
    assert_error(reply, -32600, 400)


# MAX_ARGUMENTS_BYTES ------------------------------------------------------------------------


def test_arguments_over_the_limit_are_invalid_params(rpc, limit):
    limit(MAX_ARGUMENTS_BYTES=1024)
    before = Task.objects.count()
    reply = rpc.call_tool("greet", {"name": "x" * 2000})
    error = assert_error(reply, -32602, 200)
    assert "1024" in error["message"]
    reply = rpc.call_tool("slow_compute", {"seconds": 0, "label": "x" * 2000})
    assert_error(reply, -32602, 200)
    assert Task.objects.count() == before, "no task for a refused call"


def test_arguments_are_measured_in_utf8_bytes(rpc, limit):
    limit(MAX_ARGUMENTS_BYTES=1024)
    assert rpc.call_tool("greet", {"name": "é" * 400}).status == 200  # 800 bytes
    assert_error(rpc.call_tool("greet", {"name": "é" * 600}), -32602, 200)  # 1200 bytes


def test_arguments_under_the_limit_are_served(rpc, limit):
    limit(MAX_ARGUMENTS_BYTES=1024)
    reply = rpc.call_tool("greet", {"name": "x" * 900})
    assert reply.status == 200 and reply.ok, reply


# MAX_INPUT_RESPONSES_BYTES --------------------------------------------------------------------


def test_task_answers_over_the_limit_are_refused_and_change_nothing(rpc, limit):
    limit(MAX_INPUT_RESPONSES_BYTES=1024)
    task = waiting_task(keys=["first"], owner=ANON)
    reply = rpc.tasks_update(task.id, {"first": accept(text="x" * 2000)})
    error = assert_error(reply, -32602, 200)
    assert "1024" in error["message"]
    assert InputRequest.objects.get(task_id=task.id, key="first").state == InputRequestState.PENDING
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED
    ok = rpc.tasks_update(task.id, {"first": accept(text="short")})
    assert ok.status == 200 and ok.ok, ok
    assert InputRequest.objects.get(task_id=task.id, key="first").state == InputRequestState.ANSWERED


def test_mrtr_answers_over_the_limit_are_refused(rpc, limit):
    limit(MAX_INPUT_RESPONSES_BYTES=1024)
    first = rpc.call_tool("test_input_required_result_elicitation")
    assert first.result["resultType"] == "input_required", first
    answer = {"user_name": accept(name="x" * 2000)}
    reply = rpc.call_tool(
        "test_input_required_result_elicitation",
        extra={"inputResponses": answer, "requestState": first.result["requestState"]},
    )
    assert_error(reply, -32602, 200)


# MAX_ACTIVE_TASKS_PER_OWNER -------------------------------------------------------------------


def test_active_task_quota_per_owner(rpc, client, limit, token_for):
    limit(MAX_ACTIVE_TASKS_PER_OWNER=3)
    created = [rpc.create_task("slow_compute", {"seconds": 60}) for _ in range(3)]
    reply = rpc.call_tool("slow_compute", {"seconds": 60})
    error = assert_rate_limited(reply, at_most_seconds=60)
    assert "3" in error["message"]
    assert Task.objects.filter(owner=ANON).count() == 3, "the refused call created nothing"
    # Another owner has a quota of its own.
    other = DjangoRpc(client, token=token_for("quota-bob"))
    assert other.call_tool("slow_compute", {"seconds": 60}).result["resultType"] == "task"
    # A finished task frees its place.
    assert rpc.tasks_cancel(created[0]).status == 200
    assert rpc.call_tool("slow_compute", {"seconds": 60}).result["resultType"] == "task"
    # Waiting for input counts as active too.
    assert_rate_limited(rpc.call_tool("confirm_delete", {"filename": "f"}), at_most_seconds=60)


def _try_create(owner: str, outcomes: list[str], barrier: threading.Barrier | None = None) -> None:
    """On a thread of its own: create a task for ``owner`` and append
    ``created`` or ``refused`` (over the quota) to ``outcomes``."""
    from django.db import connection

    try:
        if barrier is not None:
            barrier.wait()
        try:
            lifecycle.create_task(owner=owner, tool_name="slow_compute", arguments={}, enqueue=False)
            outcomes.append("created")  # list.append is atomic
        except lifecycle.TooManyActiveTasks:
            outcomes.append("refused")
    finally:
        connection.close()


def test_active_task_quota_is_exact_under_concurrency(limit):
    limit(MAX_ACTIVE_TASKS_PER_OWNER=5)
    results: list[str] = []
    barrier = threading.Barrier(12)
    threads = [threading.Thread(target=_try_create, args=("racer", results, barrier)) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == ["created"] * 5 + ["refused"] * 7
    assert Task.objects.filter(owner="racer").count() == 5


def _active_tasks(owner: str, count: int) -> None:
    from django.utils import timezone

    now = timezone.now()
    Task.objects.bulk_create(
        Task(owner=owner, tool_name="slow_compute", status=TaskStatus.WORKING, created_at=now, updated_at=now)
        for _ in range(count)
    )
    # Written around the lifecycle: recount them, as the prune's reconcile would.
    lifecycle.reconcile()


def _create_in_open_transaction(owner: str, created: threading.Event, release: threading.Event) -> None:
    """Create a task and keep its transaction open until ``release``."""
    from django.db import connection, transaction

    try:
        with transaction.atomic():
            lifecycle.create_task(owner=owner, tool_name="slow_compute", arguments={}, enqueue=False)
            created.set()
            release.wait(30)
    finally:
        connection.close()


@postgres_only.CONCURRENT_WRITERS
def test_creations_far_below_the_quota_do_not_wait_for_each_other(limit):
    """Far below the limit, one owner's creations share the owner's lock: a
    creation whose transaction is still open holds up no other."""
    limit(MAX_ACTIVE_TASKS_PER_OWNER=lifecycle.QUOTA_LOCK_MARGIN + 100)
    created, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_create_in_open_transaction, args=("sharer", created, release))
    holder.start()
    try:
        assert created.wait(10)
        started = time.monotonic()
        lifecycle.create_task(owner="sharer", tool_name="slow_compute", arguments={}, enqueue=False)
        assert time.monotonic() - started < 2, "a creation waited for another one's commit"
    finally:
        release.set()
        holder.join(30)
    assert Task.objects.filter(owner="sharer").count() == 2


def test_near_the_quota_a_creation_waits_for_those_in_flight(limit):
    """Near the limit the count is taken under the owner's lock held alone:
    it waits for a creation still in flight and counts it."""
    cap = lifecycle.QUOTA_LOCK_MARGIN + 10
    limit(MAX_ACTIVE_TASKS_PER_OWNER=cap)
    _active_tasks("edge", cap - 2)  # near the limit: two places left
    created, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_create_in_open_transaction, args=("edge", created, release))
    holder.start()
    outcomes: list[str] = []
    try:
        assert created.wait(10)
        racers = [threading.Thread(target=_try_create, args=("edge", outcomes)) for _ in range(3)]
        for racer in racers:
            racer.start()
        time.sleep(0.5)
        assert outcomes == [], "a creation near the limit went ahead of one still in flight"
    finally:
        release.set()
        holder.join(30)
    for racer in racers:
        racer.join(30)
    assert sorted(outcomes) == ["created", "refused", "refused"]
    assert Task.objects.filter(owner="edge", status__in=["working", "input_required"]).count() == cap


# THROTTLE_RATES -----------------------------------------------------------------------------


def test_call_rate_per_owner(rpc, client, limit, token_for):
    limit(THROTTLE_RATES={"call": "3/m"})
    for _ in range(3):
        assert rpc.call_tool("greet", {"name": "a"}).ok
    assert_rate_limited(rpc.call_tool("greet", {"name": "a"}), at_most_seconds=60)
    other = DjangoRpc(client, token=token_for("rate-bob"))
    assert other.call_tool("greet", {"name": "b"}).ok, "each owner has its own budget"


def test_call_rate_window_passes(rpc, limit):
    limit(THROTTLE_RATES={"call": "2/s"})
    assert rpc.call_tool("greet", {"name": "a"}).ok
    assert rpc.call_tool("greet", {"name": "a"}).ok
    refused = rpc.call_tool("greet", {"name": "a"})
    if refused.ok:  # the one-second window turned between the calls
        refused = rpc.call_tool("greet", {"name": "a"})
    assert_rate_limited(refused, at_most_seconds=1)
    time.sleep(1.05)
    assert rpc.call_tool("greet", {"name": "a"}).ok, "a new window has a new budget"


def test_update_rate_covers_update_and_cancel(rpc, limit):
    limit(THROTTLE_RATES={"update": "2/m"})
    task = waiting_task(keys=["first", "second"], owner=ANON)
    assert rpc.tasks_update(task.id, {"first": accept(ok=True)}).ok
    assert rpc.tasks_update(task.id, {"nothing": accept(ok=True)}).ok
    refused = rpc.tasks_cancel(task.id)
    assert_rate_limited(refused, at_most_seconds=60)
    assert Task.objects.get(pk=task.id).status == TaskStatus.INPUT_REQUIRED, "a refused cancel cancels nothing"
    assert_rate_limited(rpc.tasks_update(task.id, {"second": accept(ok=True)}), at_most_seconds=60)
    row = InputRequest.objects.get(task_id=task.id, key="second")
    assert row.state == InputRequestState.PENDING, "a refused answer is not applied"


def test_listen_rate(rpc, limit):
    limit(THROTTLE_RATES={"listen": "0/m"})
    task = running_task(owner=ANON)
    reply = rpc.request("subscriptions/listen", {"notifications": {"taskIds": [task.id]}})
    assert_rate_limited(reply, at_most_seconds=60)


def test_unlisted_kind_is_not_throttled(rpc, limit):
    limit(THROTTLE_RATES={})
    for _ in range(30):
        assert rpc.call_tool("greet", {"name": "a"}).ok


def test_requests_are_served_uncounted_while_the_throttle_cache_is_down(rpc, limit, settings, caplog):
    """A shared throttle cache (Redis) that is down does not take the endpoint
    with it (counted in the cache itself, ``THROTTLE_SYNC_MS`` 0; for the
    counts kept in the process see tests/test_throttle_counts.py)."""
    settings.CACHES = {
        **settings.CACHES,
        # Nothing listens on port 1: every cache call fails to connect.
        "down": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    }
    limit(THROTTLE_RATES={"call": "1/m"}, THROTTLE_CACHE="down", THROTTLE_SYNC_MS=0)
    for _ in range(3):
        assert rpc.call_tool("greet", {"name": "a"}).ok
    assert "throttle cache 'down' unavailable" in caplog.text


def test_a_misnamed_throttle_cache_is_an_error_not_an_outage(limit):
    """Only a cache that fails is served uncounted; one that ``CACHES`` does not
    name raises (``mcptasks.E007`` refuses it at start-up)."""
    from mcptasks.protocol import limits

    limit(THROTTLE_RATES={"call": "1/m"}, THROTTLE_CACHE="nope", THROTTLE_SYNC_MS=0)
    with pytest.raises(KeyError, match="nope"):
        limits.throttle("call", "someone")


@pytest.fixture
def redis_throttle(limit, settings) -> Iterator[Any]:
    """A Django ``RedisCache`` as the throttle cache, its keys and connections
    named for this test; yields an admin client on the same Redis."""
    import os
    import uuid

    import redis

    url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    name = f"mcptasks-throttle-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {
        **settings.CACHES,
        "shared": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": name,
            "OPTIONS": {"client_name": name},  # names our connections in CLIENT LIST
        },
    }
    limit(THROTTLE_CACHE="shared")
    admin = redis.Redis.from_url(url)
    admin.mcptasks_name = name
    try:
        yield admin
    finally:
        for key in admin.scan_iter(f"{name}:*"):
            admin.delete(key)
        admin.close()


def test_a_redis_throttle_cache_keeps_one_connection_across_requests(rpc, limit, redis_throttle):
    """Every request runs in a context of its own, where Django's ``caches``
    gives a new backend object: the throttle must not open a new Redis
    connection per request (it did, and it cost a third of a tools/call).
    Counted in Redis itself (``THROTTLE_SYNC_MS`` 0), every request uses it."""
    import contextvars

    limit(THROTTLE_RATES={"call": "1000/m"}, THROTTLE_SYNC_MS=0)

    def ours() -> int:
        return sum(1 for client in redis_throttle.client_list() if client.get("name") == redis_throttle.mcptasks_name)

    for _ in range(30):
        # A context of its own per request, as an ASGI server gives each one.
        assert contextvars.Context().run(rpc.call_tool, "greet", {"name": "a"}).ok
    assert 1 <= ours() <= 2, f"{ours()} Redis connections for 30 requests"


def test_a_redis_throttle_cache_counts_exactly(rpc, limit, redis_throttle):
    """Counted in Redis itself (``THROTTLE_SYNC_MS`` 0), the counter (one
    pipelined SET NX EX + INCR per request) allows exactly the rate, answers
    429 past it, and its key expires with the window."""
    limit(THROTTLE_RATES={"call": "3/m"}, THROTTLE_SYNC_MS=0)
    assert [rpc.call_tool("greet", {"name": "a"}).ok for _ in range(3)] == [True] * 3
    assert_rate_limited(rpc.call_tool("greet", {"name": "a"}), at_most_seconds=60)
    keys = list(redis_throttle.scan_iter(f"{redis_throttle.mcptasks_name}:*throttle:call:*"))
    assert len(keys) == 1
    assert int(redis_throttle.get(keys[0])) == 4
    assert 0 < redis_throttle.ttl(keys[0]) <= 61
    # Django's own API reads the same counter (its key is KEY_PREFIX:version:key).
    assert throttle_cache().get(keys[0].decode().split(":", 2)[2]) == 4


def test_a_redis_throttle_cache_holds_the_poll_burst(rpc, limit, redis_throttle):
    limit(POLL_BURST=2)
    task = running_task(owner=ANON, poll_interval_ms=60_000)
    assert rpc.tasks_get(task.id).ok
    assert rpc.tasks_get(task.id).ok
    assert_rate_limited(rpc.tasks_get(task.id), at_most_seconds=60)


# POLL_BURST ----------------------------------------------------------------------------------


def test_polling_faster_than_the_interval_is_throttled(rpc, client, limit, token_for):
    """tasks/get of one task past ``POLL_BURST`` polls per ``pollIntervalMs``
    window: 429 with -31000, asking the client to wait at most one interval."""
    limit(POLL_BURST=3, POLL_INTERVAL_MS=60_000)
    task_id = rpc.create_task("slow_compute", {"seconds": 60})
    interval = rpc.tasks_get(task_id).result["pollIntervalMs"]
    assert interval == 60_000
    for _ in range(2):
        assert rpc.tasks_get(task_id).ok
    refused = rpc.tasks_get(task_id)
    assert_rate_limited(refused, at_most_seconds=interval / 1000)
    # Per task: another task of the same owner is polled freely.
    other_task = rpc.create_task("slow_compute", {"seconds": 60})
    assert rpc.tasks_get(other_task).ok


def test_poll_burst_off(rpc, limit):
    limit(POLL_BURST=None, POLL_INTERVAL_MS=60_000)
    task_id = rpc.create_task("slow_compute", {"seconds": 60})
    for _ in range(30):
        assert rpc.tasks_get(task_id).ok


def test_polls_of_an_unknown_task_look_like_any_unknown_task(rpc, limit):
    """The throttle must not tell a stranger's task from a missing one."""
    limit(POLL_BURST=1, POLL_INTERVAL_MS=60_000)
    stranger = running_task(owner="someone-else")
    for _ in range(3):
        mine = rpc.tasks_get("no-such-task-0000000000000000000")
        theirs = rpc.tasks_get(stranger.id)
        assert (mine.status, mine.error) == (theirs.status, theirs.error)


# MAX_TTL_MS --------------------------------------------------------------------------------------


def test_default_ttl_is_clamped_to_the_maximum(rpc, limit):
    limit(DEFAULT_TTL_MS=10**12, MAX_TTL_MS=60_000)
    task_id = rpc.create_task("slow_compute", {"seconds": 60})
    assert rpc.tasks_get(task_id).result["ttlMs"] == 60_000
    task = Task.objects.get(pk=task_id)
    assert (task.expires_at - task.created_at).total_seconds() == 60


def test_a_tools_ttl_is_clamped_to_the_maximum(rpc, limit):
    from mcptasks.tools.registry import registry, tool

    limit(MAX_TTL_MS=60_000)

    def forever(ctx) -> str:  # an unannotated ctx receives the ToolContext
        return "never read"

    tool(forever, name="limits_long_ttl", task="required", ttl_ms=10**12)
    try:
        reply = rpc.call_tool("limits_long_ttl")
        assert reply.result["ttlMs"] == 60_000, reply
    finally:
        registry.unregister("limits_long_ttl")


def test_clamp_ttl():
    assert lifecycle.clamp_ttl(None) >= 0
    assert lifecycle.clamp_ttl(10**15) == mcp_settings.MAX_TTL_MS
    assert lifecycle.clamp_ttl(-5) == 0
    assert lifecycle.clamp_ttl(1234) == 1234


# Origin and Host ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    ["https://evil.example", "null", "http://127.0.0.1.evil.example", "file://", "http://localhost.evil.example"],
)
def test_foreign_origin_is_403(rpc, origin):
    before = Task.objects.count()
    reply = rpc.call_tool("slow_compute", {"seconds": 0}, headers={"Origin": origin})
    assert_error(reply, -32600, 403)
    assert Task.objects.count() == before, "nothing runs for a refused origin"


@pytest.mark.parametrize(
    "origin", ["http://localhost:3000", "http://127.0.0.1", "http://[::1]:8080", "http://testserver"]
)
def test_own_origins_are_allowed(rpc, origin):
    assert rpc.call_tool("greet", {"name": "o"}, headers={"Origin": origin}).ok


def test_malformed_origin_is_403_not_a_crash(rpc):
    reply = rpc.call_tool("greet", {"name": "o"}, headers={"Origin": "http://[::1"})
    assert_error(reply, -32600, 403)


def test_allowed_origins_setting_replaces_the_default(rpc, limit):
    limit(ALLOWED_ORIGINS=["https://app.example"])
    assert rpc.call_tool("greet", {"name": "o"}, headers={"Origin": "https://app.example"}).ok
    assert_error(rpc.call_tool("greet", {"name": "o"}, headers={"Origin": "http://localhost"}), -32600, 403)


@pytest.mark.parametrize("host", ["evil.example", "attacker.localhost", "127.0.0.1.nip.io"])
def test_foreign_host_is_400(rpc, host):
    # Through Django's handler the site's middleware may refuse the Host first
    # (with its own 400 page); the live test below checks the JSON-RPC body.
    reply = rpc.call_tool("greet", {"name": "h"}, headers={"Host": host})
    assert reply.status == 400, reply
    assert "result" not in (reply.body or {})


# Credentials -------------------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", ["Bearer not-a-token", "Bearer", "Bearer a b", "Token nope"])
def test_bad_credentials_are_401(rpc, authorization):
    reply = rpc.request("tools/list", request_id=41, headers={"Authorization": authorization})
    assert_error(reply, -32600, 401)
    assert reply.body.get("id") == 41
    assert reply.headers.get("WWW-Authenticate"), "a 401 says how to authenticate"


def test_no_credentials_when_anonymous_is_off_is_401(rpc, limit):
    limit(ALLOW_ANONYMOUS=False)
    reply = rpc.request("tools/list")
    assert_error(reply, -32600, 401)


def test_unrelated_authorization_schemes_are_ignored(rpc):
    assert rpc.request("tools/list", headers={"Authorization": "Basic dXNlcjpwYXNz"}).ok
