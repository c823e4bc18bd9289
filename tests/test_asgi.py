"""The ASGI route for /mcp (mcptasks.web.asgi), driven in-process as a server would."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mcptasks.models import Task
from tests.support import postgres_only
from tests.support.asgi import AsgiRpc, serve_asgi
from tests.support.factories import completed_task, running_task

pytestmark = pytest.mark.django_db(transaction=True)


def serve(method: str, params: dict[str, Any], on_send: Any = None) -> tuple[int, dict[str, Any]]:
    """One request through ``mcp_router``; ``on_send(message)`` sees each
    message as the server would send it."""
    status, _, payload = serve_asgi(method, params, on_send=on_send)
    return status, payload


def test_a_created_run_is_published_before_the_answer_is_sent(published):
    """A client that has its task handle has a run on its way: a web process
    killed right after answering loses nothing, not even time."""
    runs_when_answered: list[int] = []

    def on_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            runs_when_answered.append(sum(1 for m in published if m["task"] == "mcptasks.run_task"))

    status, reply = serve("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}}, on_send)
    assert status == 200, reply
    task_id = reply["result"]["taskId"]
    assert runs_when_answered == [1]
    assert [m["args"] for m in published if m["task"] == "mcptasks.run_task"] == [[task_id]]
    assert Task.objects.filter(pk=task_id).exists()


@pytest.mark.parametrize("path", ["thread", "loop"])
def test_a_poll_through_the_asgi_route(request, path, loop_served, settings):
    if path == "loop":
        if not on_postgres():
            pytest.skip(postgres_only.LOOP_POLLS_REASON)
        request.getfixturevalue("redis_poll_throttle")
    else:  # polls counted in a local-memory cache itself are not counted on the loop
        settings.MCPTASKS = {**settings.MCPTASKS, "THROTTLE_SYNC_MS": 0}
    status, created = serve("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}})
    assert status == 200, created
    task_id = created["result"]["taskId"]
    status, got = serve("tasks/get", {"taskId": task_id})
    assert status == 200, got
    assert got["result"]["taskId"] == task_id
    assert got["result"]["status"] == "working"
    assert loop_served == ([200] if path == "loop" else [])


# Polls on the event loop -------------------------------------------------------------------


def on_postgres() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


def test_polls_are_served_on_the_loop_off_postgres_their_reads_on_a_thread(loop_served, redis_poll_throttle):
    """SQLite (and any other backend) polls on the loop too, the ORM store's
    read awaited on a thread, with the same answer as on Postgres."""
    if on_postgres():
        pytest.skip("the ORM store's loop forms")
    task = running_task(owner="anonymous")
    for _ in range(3):
        status, got = serve("tasks/get", {"taskId": task.id})
        assert status == 200, got
        assert got["result"]["status"] == "working"
    assert loop_served == [200, 200, 200]


@postgres_only.LOOP_POLLS
def test_the_first_read_of_an_outcome_is_served_and_audited_on_the_loop(rpc, loop_served, redis_poll_throttle):
    """The first read of an outcome writes its audit event in the read's own
    statement, on the loop; later reads, on either path, say the same and
    write nothing."""
    from mcptasks.models import TaskEvent

    done = completed_task(owner="anonymous")
    asgi_rpc = AsgiRpc()
    asgi_rpc.tasks_get(running_task(owner="anonymous").id)  # identifies the caller, on a thread
    loop_served.clear()
    first = asgi_rpc.tasks_get(done.id)
    assert loop_served == [200]
    (event,) = TaskEvent.objects.filter(task_id=done.id, kind="result_retrieved")
    assert (event.actor, event.detail) == ("client:anonymous", {"status": "completed"})
    again = asgi_rpc.tasks_get(done.id)
    assert loop_served == [200, 200]
    on_thread = rpc.tasks_get(done.id)
    assert TaskEvent.objects.filter(task_id=done.id, kind="result_retrieved").count() == 1
    drop_id = lambda reply: {k: v for k, v in reply.body.items() if k != "id"}  # noqa: E731
    assert drop_id(first) == drop_id(again) == drop_id(on_thread)
    assert (again.status, again.headers["content-type"]) == (on_thread.status, on_thread.headers["Content-Type"])


@postgres_only.LOOP_POLLS
def test_the_poll_throttle_answers_429_on_the_loop(rpc, settings, loop_served, redis_poll_throttle):
    """The loop counts polls in the same Redis counter as the thread path."""
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": 2}
    task = running_task(owner="anonymous", poll_interval_ms=60_000)
    asgi_rpc = AsgiRpc()
    asgi_rpc.request("server/discover")  # the caller, identified on a thread
    assert asgi_rpc.tasks_get(task.id).ok
    assert asgi_rpc.tasks_get(task.id).ok
    limited = asgi_rpc.tasks_get(task.id)
    assert loop_served == [200, 200, 429]
    assert limited.error["code"] == -31000
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert 0 < limited.error["data"]["retryAfterMs"] <= 60_000
    on_thread = rpc.tasks_get(task.id)  # the fourth poll in the shared window
    assert (on_thread.status, on_thread.error["code"]) == (429, -31000)


@postgres_only.LOOP_POLLS
def test_database_down_is_the_same_503_on_both_paths(rpc, settings, monkeypatch, loop_served, redis_poll_throttle):
    from django.db import connection

    from mcptasks.tasks import sql as task_sql

    task = running_task(owner="anonymous")
    asgi_rpc = AsgiRpc()
    assert asgi_rpc.tasks_get(task.id).ok
    assert asgi_rpc.tasks_get(task.id).ok and loop_served == [200, 200]
    # Nothing listens on port 1: every new connection, on the loop or a thread, fails.
    task_sql.close_pools()
    connection.close()
    with monkeypatch.context() as patched:
        patched.setitem(connection.settings_dict, "PORT", "1")
        down_on_loop = asgi_rpc.request("tasks/get", {"taskId": task.id}, request_id=41)
        down_on_thread = rpc.request("tasks/get", {"taskId": task.id}, request_id=41)
        assert loop_served == [200, 200, 503], "the loop answers the outage itself: never served again on a thread"
        assert down_on_loop.status == down_on_thread.status == 503
        assert down_on_loop.body == down_on_thread.body
        assert down_on_loop.body["error"]["message"] == "Internal error: the task store is unavailable; retry later"
    connection.close()
    assert asgi_rpc.tasks_get(task.id).ok, "the loop reconnects"
    assert loop_served == [200, 200, 503, 200]


@postgres_only.LOOP_POLLS
def test_a_revoked_token_is_refused_once_its_cached_identity_expires(
    settings, loop_served, redis_poll_throttle, identifications
):
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    settings.MCPTASKS = {**settings.MCPTASKS, "IDENTITY_CACHE_SECONDS": 0.5}
    user = get_user_model().objects.create(username="carol")
    token = Token.objects.create(user=user)
    asgi_rpc = AsgiRpc(token=token.key)
    task = running_task(owner=f"user:{user.pk}")
    assert asgi_rpc.tasks_get(task.id).ok  # on the loop, the caller identified on a thread
    token.delete()
    assert asgi_rpc.tasks_get(task.id).ok, "within IDENTITY_CACHE_SECONDS, from the cache"
    assert loop_served == [200, 200] and identifications == ["caller"]
    time.sleep(0.6)
    refused = asgi_rpc.tasks_get(task.id)
    assert refused.status == 401
    assert loop_served == [200, 200, 401] and identifications == ["caller", "401"], "identified again, refused"


@postgres_only.LOOP_POLLS
def test_the_loop_reconnects_after_losing_its_connection(loop_served, redis_poll_throttle, monkeypatch):
    """A pooled connection that died (a database restart): the poll reads
    again on a new connection, on the loop, with the same answer (never
    served again on a thread)."""
    import asyncio
    import json

    from django.core.asgi import get_asgi_application
    from django.db import connection

    from mcptasks.web.asgi import mcp_router
    from tests.support.asgi import apost
    from tests.support.rpc import build_headers, build_meta

    task = running_task(owner="anonymous")
    assert AsgiRpc().tasks_get(task.id).ok  # the caller, identified (on a thread) and cached
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)  # for the loop's pool, made next
    params = {"taskId": task.id, "_meta": build_meta()}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": params}).encode()
    headers = build_headers("tasks/get", params)

    def end_other_sessions() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        finally:
            connection.close()

    async def polls() -> list[tuple[int, Any]]:
        app = mcp_router(get_asgi_application(), path="/mcp")
        replies = [await apost(app, body, headers)]
        # The loop's pool, made by that poll, keeps its connections; threads
        # go back to a connection per request, so only the loop's is lost.
        connection.settings_dict["CONN_MAX_AGE"] = 0
        await asyncio.to_thread(end_other_sessions)
        replies += [await apost(app, body, headers), await apost(app, body, headers)]
        return [(status, json.loads(raw)) for status, _, raw in replies]

    try:
        replies = asyncio.run(polls())
    finally:
        connection.close()  # this thread's session was ended too
    assert [status for status, _ in replies] == [200, 200, 200]
    assert replies[0][1] == replies[1][1] == replies[2][1]
    assert loop_served == [200, 200, 200, 200], "every poll on the loop, the third one reconnected"


@postgres_only.LOOP_POLLS
def test_the_loop_keeps_no_connection_past_conn_max_age(loop_served, redis_poll_throttle, monkeypatch):
    """With ``CONN_MAX_AGE = 0`` (Django's default) a poll on the loop closes
    its connection after the read, as Django closes a request's."""
    import asyncio
    import json

    from django.core.asgi import get_asgi_application
    from django.db import connection

    from mcptasks.tasks import sql as task_sql
    from mcptasks.web.asgi import mcp_router
    from tests.support.asgi import apost
    from tests.support.rpc import build_headers, build_meta

    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    task_sql.close_pools()  # what earlier tests' loops kept
    task = running_task(owner="anonymous")
    assert AsgiRpc().request("server/discover").ok  # the caller, identified and cached, on a thread
    params = {"taskId": task.id, "_meta": build_meta()}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": params}).encode()

    def sessions() -> int:
        # The loop's own connections, by name: other threads of the test
        # process (and the poll snapshot's listener, which stays by design)
        # open and close theirs on their own schedule.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
                [task_sql.LOOP_APPLICATION_NAME],
            )
            return cursor.fetchone()[0]

    async def sessions_once_closed() -> int:
        # A closed connection's server process leaves pg_stat_activity a moment
        # later (longer on a busy machine); one left open stays.
        for _ in range(50):
            if (count := await asyncio.to_thread(sessions)) == 0:
                break
            await asyncio.sleep(0.1)
        return count

    async def polls() -> list[int]:
        app = mcp_router(get_asgi_application(), path="/mcp")
        assert await sessions_once_closed() == 0
        statuses = [(await apost(app, body, build_headers("tasks/get", params)))[0] for _ in range(3)]
        assert await sessions_once_closed() == 0, "no connection left open by the loop"
        return statuses

    assert asyncio.run(polls()) == [200, 200, 200]
    assert loop_served == [200, 200, 200]
