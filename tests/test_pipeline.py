"""The request pipeline, on every path a request takes (a thread, the event
loop, the loop's poll snapshot) and in both eras:

- each request is served once: a request the loop takes is answered there,
  errors included, and never served again on a thread;
- a site's receivers of the task signals run on a thread, after the commit,
  once per event, and may use the ORM;
- every read of a finished task's outcome logs one ``mcptasks.audit`` line;
- a 2025-11-25 task cancelled or answered through 2026-07-28 methods is
  heard by its session, and resumes at once.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mcptasks import signals
from mcptasks.models import Task, TaskStatus
from mcptasks.worker.execution import run_task
from tests.support import postgres_only
from tests.support.asgi import AsgiRpc
from tests.support.factories import accept, completed_task, running_task, waiting_task
from tests.support.legacy import DjangoLegacy
from tests.support.rpc import TASKS_CAPS

pytestmark = pytest.mark.django_db(transaction=True)  # /mcp does its database work on its own threads


@pytest.fixture
def entries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every time the ASGI route starts to serve a request: on the loop
    (``handlers.serve_on_loop``) or on the thread path (``views.mcp_endpoint``)."""
    from mcptasks.protocol.modern import handlers
    from mcptasks.web import views

    seen: list[str] = []
    serve_on_loop, serve_on_thread = handlers.serve_on_loop, views.mcp_endpoint

    async def on_the_loop(*args: Any) -> Any:
        seen.append("loop")
        return await serve_on_loop(*args)

    async def on_a_thread(request: Any) -> Any:
        seen.append("thread")
        return await serve_on_thread(request)

    monkeypatch.setattr(handlers, "serve_on_loop", on_the_loop)
    monkeypatch.setattr(views, "mcp_endpoint", on_a_thread)
    return seen


class Heard:
    """What a site's receivers heard: (signal or kind, task id, the task's
    status read with the ORM in the receiver)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()

    def add(self, what: str, task_id: str) -> None:
        # The ORM, as a site's receiver uses it: SynchronousOnlyOperation on an event loop.
        status = Task.objects.filter(pk=task_id).values_list("status", flat=True).first()
        with self.lock:
            self.events.append((what, task_id, status))

    def of(self, task_id: str) -> list[tuple[str, str | None]]:
        """What was heard of the task, its status messages left out (a run may report any number)."""
        return [(what, status) for what, tid, status in self.events if tid == task_id and what != "status_message"]


@pytest.fixture
def site_receivers() -> Iterator[Heard]:
    """A site's receivers of ``task_created`` and ``task_changed`` that read the ORM."""
    heard = Heard()

    def on_created(sender: Any, task: Task, **_: Any) -> None:
        heard.add("task_created", task.id)

    def on_changed(sender: Any, task_id: str, kind: str, **_: Any) -> None:
        heard.add(kind, task_id)

    signals.task_created.connect(on_created, sender=Task, weak=False, dispatch_uid="test.site.created")
    signals.task_changed.connect(on_changed, sender=Task, weak=False, dispatch_uid="test.site.changed")
    try:
        yield heard
    finally:
        signals.task_created.disconnect(dispatch_uid="test.site.created", sender=Task)
        signals.task_changed.disconnect(dispatch_uid="test.site.changed", sender=Task)


def _loop_only(client: object, entries: list[str], count: int) -> None:
    """On the loop path, each of the test's ``count`` requests entered the
    loop's pipeline once and no other."""
    if isinstance(client, AsgiRpc):
        assert entries == ["loop"] * count, entries


# Each request served once ------------------------------------------------------------------


def test_a_site_receiver_reading_the_orm_leaves_one_task_per_call_on_both_paths(poll_rpc, entries, site_receivers):
    """The issue's repro: 10 calls left 20 rows. Now 10 calls, 10 rows, and
    each receiver ran once per event, after the commit (it reads the row)."""
    entries.clear()  # the fixture's discovery, served on a thread
    created = [
        poll_rpc.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS).result["taskId"] for _ in range(10)
    ]
    assert Task.objects.filter(owner="anonymous").count() == 10
    assert sorted(Task.objects.values_list("id", flat=True)) == sorted(created)
    for task_id in created:
        assert sorted(site_receivers.of(task_id)) == [("created", "working"), ("task_created", "working")]
    _loop_only(poll_rpc, entries, 10)


@pytest.fixture
def thread_hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each step the event loop awaited on a thread (``threads.on_a_thread``,
    wherever a module of the app holds it)."""
    import sys

    from mcptasks import threads

    hops: list[str] = []
    hop = threads.on_a_thread

    async def counted(work: Any) -> Any:
        hops.append(getattr(work, "__qualname__", repr(work)))
        return await hop(work)

    holders = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("mcptasks") and getattr(m, "on_a_thread", None) is hop
    ]
    assert threads in holders and len(holders) > 2, "the store and the task methods hold it too"
    for module in holders:
        monkeypatch.setattr(module, "on_a_thread", counted)
    return hops


@postgres_only.LOOP_POLLS
def test_a_change_no_site_code_hears_takes_no_thread_on_the_loop(entries, redis_poll_throttle, loop_runs, thread_hops):
    """The app's own publishers read no ORM for a 2026-era task, so its
    creation and cancel are announced on the loop; a site receiver takes the
    thread hop, once per change."""
    from mcptasks.tasks import events

    assert events._publishers, "the test site publishes changes (a channel layer is configured)"
    client = AsgiRpc()
    client.request("server/discover")  # identifies the caller, on a thread
    thread_hops.clear()
    task_id = client.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS).result["taskId"]
    assert client.tasks_cancel(task_id).ok
    assert thread_hops == []

    heard = Heard()

    def on_changed(sender: Any, task_id: str, kind: str, **_: Any) -> None:
        heard.add(kind, task_id)

    signals.task_changed.connect(on_changed, sender=Task, weak=False, dispatch_uid="test.site.hops")
    try:
        other = client.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS).result["taskId"]
        assert client.tasks_cancel(other).ok
    finally:
        signals.task_changed.disconnect(dispatch_uid="test.site.hops", sender=Task)
    assert len(thread_hops) == 2
    assert heard.of(other) == [("created", "working"), ("transition", "cancelled")]
    assert entries.count("loop") == 4


def test_a_site_receiver_hears_each_change_once_on_both_paths(poll_rpc, entries, site_receivers):
    entries.clear()
    working, waiting = running_task(owner="anonymous"), waiting_task(owner="anonymous", keys=["a"])
    site_receivers.events.clear()
    assert poll_rpc.tasks_cancel(working.id).ok
    assert poll_rpc.tasks_cancel(working.id).ok  # already final: nothing moves, nothing is heard
    assert poll_rpc.tasks_update(waiting.id, {"a": accept(ok=True)}).ok
    assert site_receivers.of(working.id) == [("transition", "cancelled")]
    assert site_receivers.of(waiting.id) == [("transition", "working")]
    _loop_only(poll_rpc, entries, 3)


def test_a_receiver_that_raises_is_logged_and_the_call_answered_once_on_both_paths(poll_rpc, entries, caplog):
    """A site's receiver with a bug: the task is committed, so the call is
    answered with it, once; the receiver's error is logged; the others ran."""

    def broken(sender: Any, **_: Any) -> None:
        raise RuntimeError("a site receiver's bug")

    signals.task_created.connect(broken, sender=Task, weak=False, dispatch_uid="test.site.broken")
    caplog.set_level(logging.ERROR, logger="mcptasks.lifecycle")
    entries.clear()
    try:
        replies = [poll_rpc.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS) for _ in range(3)]
    finally:
        signals.task_created.disconnect(dispatch_uid="test.site.broken", sender=Task)
    assert [r.result["resultType"] for r in replies] == ["task"] * 3
    assert sorted(Task.objects.values_list("id", flat=True)) == sorted(r.result["taskId"] for r in replies)
    failures = [r for r in caplog.records if r.name == "mcptasks.lifecycle" and r.levelno == logging.ERROR]
    assert len(failures) == 3 and all("a site receiver's bug" in str(r.exc_info[1]) for r in failures)
    _loop_only(poll_rpc, entries, 3)


def test_an_error_after_the_commit_is_answered_as_an_error_once_on_both_paths(poll_rpc, entries, monkeypatch):
    from mcptasks.protocol.modern import handlers

    def broken(task: Task) -> dict[str, Any]:
        raise RuntimeError("after the commit")

    monkeypatch.setattr(handlers, "create_task_result", broken)
    entries.clear()
    reply = poll_rpc.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS)
    assert reply.status == 500 and reply.error["message"] == "Internal error"
    assert Task.objects.filter(owner="anonymous").count() == 1, "committed once, never created again"
    _loop_only(poll_rpc, entries, 1)


@postgres_only.LOOP_POLLS
def test_a_database_outage_on_the_loop_is_answered_there(entries, redis_poll_throttle, loop_runs, monkeypatch):
    """A creation whose statement fails on the loop is a 503, not a second
    try on a thread (which, had the first committed, would create twice)."""
    from django.db import connection

    from mcptasks.tasks import sql as task_sql

    client = AsgiRpc()
    client.request("server/discover")
    entries.clear()
    task_sql.close_pools()
    with monkeypatch.context() as patched:
        patched.setitem(connection.settings_dict, "PORT", "1")  # nothing listens there
        down = client.call_tool("slow_compute", {"seconds": 30}, capabilities=TASKS_CAPS)
    task_sql.close_pools()
    connection.close()
    assert down.status == 503
    assert down.error["message"] == "Internal error: the task store is unavailable; retry later"
    assert entries == ["loop"]
    assert not Task.objects.exists()


@postgres_only.LOOP_POLLS
def test_a_callers_first_request_is_served_on_the_loop_its_authentication_on_a_thread(
    entries, identifications, loop_served, redis_poll_throttle, django_user_model
):
    """The identity cache's miss is a step awaited on a thread, not a reason
    to serve the request elsewhere; a refusal is answered on the loop too."""
    from rest_framework.authtoken.models import Token

    user = django_user_model.objects.create(username="dora")
    client = AsgiRpc(token=Token.objects.create(user=user).key)
    task = running_task(owner=f"user:{user.pk}")
    assert client.tasks_get(task.id).result["status"] == "working"
    assert client.tasks_get(task.id).result["status"] == "working"
    assert entries == ["loop", "loop"] and identifications == ["caller"], "identified once, then from the cache"
    refused = AsgiRpc(token="not-a-token").tasks_get(task.id)
    assert refused.status == 401
    assert identifications == ["caller", "401"]
    assert loop_served == [200, 200, 401] and "thread" not in entries, "refused on the loop, before the method"


# Every path, both eras --------------------------------------------------------------------


def test_site_receivers_run_once_per_event_in_the_worker_and_the_2025_era(client, site_receivers):
    session = DjangoLegacy(client)
    session.initialize()
    created = [session.create_task("slow_compute", {"seconds": 0}) for _ in range(3)]
    assert Task.objects.filter(era="2025-11-25").count() == 3
    run_task(created[0])  # the worker's path: a run and its finish
    assert session.request("tasks/cancel", {"taskId": created[1]}).ok
    assert site_receivers.of(created[0]) == [
        ("task_created", "working"),
        ("created", "working"),
        ("transition", "completed"),
    ]
    assert site_receivers.of(created[1]) == [
        ("task_created", "working"),
        ("created", "working"),
        ("transition", "cancelled"),
    ]
    assert site_receivers.of(created[2]) == [("task_created", "working"), ("created", "working")]


# One audit line per outcome read ------------------------------------------------------------


@pytest.fixture
def audit_lines(settings: Any, caplog: pytest.LogCaptureFixture) -> Any:
    """``audit_lines(task_id)``: the ``mcptasks.audit`` lines logged for it.
    (Each in-process ASGI request sets Django up, which would configure
    logging again and drop the level set here: not in these tests.)"""
    settings.LOGGING_CONFIG = None
    caplog.set_level(logging.INFO, logger="mcptasks.audit")
    return lambda task_id: _audit_lines(caplog, task_id)


def _audit_lines(caplog: pytest.LogCaptureFixture, task_id: str) -> int:
    return sum(1 for r in caplog.records if r.name == "mcptasks.audit" and getattr(r, "task_id", None) == task_id)


def test_each_outcome_read_logs_one_audit_line_on_both_paths(poll_rpc, audit_lines):
    task = completed_task(owner="anonymous")
    for _ in range(7):
        assert poll_rpc.tasks_get(task.id).result["status"] == "completed"
    assert audit_lines(task.id) == 7


def test_a_poll_refused_by_the_throttle_reads_no_outcome_and_logs_no_line_on_both_paths(
    poll_rpc, audit_lines, settings
):
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": 2}
    task = completed_task(owner="anonymous", poll_interval_ms=60_000)
    replies = [poll_rpc.tasks_get(task.id) for _ in range(3)]
    assert [r.status for r in replies] == [200, 200, 429]
    assert audit_lines(task.id) == 2


@postgres_only.POLL_SNAPSHOT
def test_each_outcome_read_logs_one_audit_line_from_the_poll_snapshot(redis_poll_throttle, audit_lines):
    """Seven polls on one event loop: the first marks the outcome read, the
    later ones are answered from the snapshot; seven lines all the same."""
    from django.core.asgi import get_asgi_application

    from mcptasks.tasks import poll_snapshot
    from mcptasks.web.asgi import mcp_router
    from tests.support.asgi import apost
    from tests.support.rpc import build_headers, build_meta

    task = completed_task(owner="anonymous", poll_interval_ms=1)
    AsgiRpc().request("server/discover")  # the caller, identified on a thread
    params = {"taskId": task.id, "_meta": build_meta()}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": params}).encode()
    headers = build_headers("tasks/get", params)

    async def polls() -> tuple[list[int], int]:
        app = mcp_router(get_asgi_application(), path="/mcp")
        try:
            await apost(app, body, headers)  # starts this loop's snapshot
            snapshot = poll_snapshot.current()
            assert snapshot is not None
            while not snapshot.up:
                await asyncio.sleep(0.01)
            statuses = [(await apost(app, body, headers))[0] for _ in range(6)]
            stats = poll_snapshot.stats()
            return statuses, stats.served if stats is not None else 0
        finally:
            poll_snapshot.close_all()

    statuses, served = asyncio.run(polls())
    assert statuses == [200] * 6
    assert served >= 3, "the later polls were answered from the snapshot"
    assert audit_lines(task.id) == 7


# 2025-11-25 tasks through 2026-07-28 methods -----------------------------------------------


@pytest.fixture
def session_statuses(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[DjangoLegacy, list[str]]]:
    """A 2025-11-25 session whose GET stream follows its group, and the
    statuses published to that group (each also sent on)."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer
    from django.test import Client

    from mcptasks.notify import fabric as notify
    from mcptasks.notify import followers
    from mcptasks.protocol.legacy import sessions as legacy_sessions

    session = DjangoLegacy(Client())
    session.initialize()
    group = legacy_sessions.session_group(session.session_id)
    statuses: list[str] = []
    publish = notify.publisher.publish

    def heard(to: str, payload: dict[str, Any]) -> None:
        if to == group and "notification" in payload:
            statuses.append(payload["notification"]["params"]["status"])
        publish(to, payload)

    monkeypatch.setattr(notify.publisher, "publish", heard)
    registry = followers.registry_of(get_channel_layer())
    assert registry is not None
    async_to_sync(registry.register)([group], "test-stream", 60)
    try:
        yield session, statuses
    finally:
        async_to_sync(registry.unregister)([group], "test-stream")


def test_a_2025_task_cancelled_through_2026_is_heard_by_its_session(poll_rpc, entries, session_statuses):
    session, statuses = session_statuses
    task_id = session.create_task("slow_compute", {"seconds": 30})
    entries.clear()
    assert poll_rpc.tasks_cancel(task_id).ok
    assert Task.objects.get(pk=task_id).status == TaskStatus.CANCELLED
    assert statuses == ["working", "cancelled"]
    _loop_only(poll_rpc, entries, 1)


def test_a_2025_task_answered_through_2026_resumes_at_once(poll_rpc, entries, session_statuses, published, request):
    session, statuses = session_statuses
    task_id = session.create_task("confirm_delete", {"filename": "a.txt"})
    run_task(task_id)
    assert Task.objects.get(pk=task_id).status == TaskStatus.INPUT_REQUIRED
    published.clear()
    entries.clear()
    assert poll_rpc.tasks_update(task_id, {"confirm": accept(confirm=True)}).ok
    assert Task.objects.get(pk=task_id).status == TaskStatus.WORKING
    assert statuses == ["working", "input_required", "working"]
    if isinstance(poll_rpc, AsgiRpc):  # its run sent from the loop, straight to Redis
        url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        queued = redis.Redis.from_url(url).lrange(request.getfixturevalue("loop_runs"), 0, -1)
        assert [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in queued] == [task_id]
    else:
        assert [m["args"][0] for m in published if m["task"] == "mcptasks.run_task"] == [task_id]
    _loop_only(poll_rpc, entries, 1)
    run_task(task_id)
    assert Task.objects.get(pk=task_id).result["content"][0]["text"] == "Deleted a.txt"
