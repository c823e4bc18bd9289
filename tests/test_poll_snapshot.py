"""The poll snapshot (mcptasks.tasks.poll_snapshot): its bookkeeping, its
invalidation by real NOTIFYs of committed changes, the flush on reconnect, the
setting, and the fence under a racing writer."""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.asgi import get_asgi_application
from django.db import connection
from django.utils import timezone

from mcptasks.models import Task, TaskStatus
from mcptasks.tasks import poll_snapshot
from mcptasks.tasks import reads as task_reads
from mcptasks.web.asgi import mcp_router
from tests.support import postgres_only
from tests.support.asgi import apost
from tests.support.factories import completed_task, running_task, waiting_task
from tests.support.rpc import build_headers, build_meta


def row(task_id: str = "t1", owner: str = "alice", status: str = TaskStatus.WORKING, **kw: Any) -> Task:
    now = timezone.now()
    fields: dict[str, Any] = {"created_at": now, "updated_at": now, "ttl_ms": 60_000, "poll_interval_ms": 1000}
    return Task(id=task_id, owner=owner, tool_name="slow_compute", status=status, **{**fields, **kw})


def up_snapshot(capacity: int = 100) -> poll_snapshot.Snapshot:
    snapshot = poll_snapshot.Snapshot(Task.objects.db, capacity)
    snapshot.up = True  # as the listener sets it once it listens
    return snapshot


# Bookkeeping, without a listener --------------------------------------------------------


def test_a_kept_row_answers_its_owner_only():
    snapshot = up_snapshot()
    assert snapshot.store(row(), snapshot.applied)
    assert snapshot.cached("t1", "alice") is not None
    assert snapshot.cached("t1", "mallory") is None


def test_nothing_is_kept_while_the_listener_is_down():
    snapshot = up_snapshot()
    snapshot.up = False
    assert not snapshot.store(row(), snapshot.applied)
    assert snapshot.cached("t1", "alice") is None


def test_a_row_read_before_a_change_is_applied_is_not_kept():
    snapshot = up_snapshot()
    token = snapshot.applied
    snapshot.invalidate("t1")  # committed after the read began
    assert not snapshot.store(row(), token)
    assert snapshot.store(row(), snapshot.applied), "a read begun after the change may be kept"


def test_a_change_of_another_task_does_not_refuse_a_row():
    snapshot = up_snapshot()
    token = snapshot.applied
    snapshot.invalidate("t2")
    assert snapshot.store(row(), token)


def test_an_applied_change_drops_the_row():
    snapshot = up_snapshot()
    snapshot.store(row(), snapshot.applied)
    snapshot.invalidate("t1")
    assert snapshot.cached("t1", "alice") is None


def test_a_flush_empties_and_refuses_reads_begun_before_it():
    snapshot = up_snapshot()
    snapshot.store(row("t1"), snapshot.applied)
    token = snapshot.applied
    snapshot.flush()
    assert snapshot.cached("t1", "alice") is None
    assert not snapshot.store(row("t2"), token)
    assert snapshot.store(row("t2"), snapshot.applied)


def test_forgotten_invalidation_marks_refuse_older_reads():
    snapshot = up_snapshot(capacity=1)
    token = snapshot.applied
    for n in range(5):  # more marks than kept: they are dropped
        snapshot.invalidate(f"other-{n}")
    snapshot.invalidate("t1")
    assert not snapshot.store(row("t1"), token)


def test_only_rows_that_may_be_served_are_kept():
    snapshot = up_snapshot()
    read_at = timezone.now()
    assert not snapshot.store(row("wait", status=TaskStatus.INPUT_REQUIRED), snapshot.applied)
    assert not snapshot.store(row("unread", status=TaskStatus.COMPLETED), snapshot.applied), "first read writes"
    assert snapshot.store(row("read", status=TaskStatus.COMPLETED, outcome_read_at=read_at), snapshot.applied)
    assert snapshot.store(row("cancelled", status=TaskStatus.CANCELLED, outcome_read_at=read_at), snapshot.applied)


def test_the_oldest_row_goes_first_past_the_capacity():
    snapshot = up_snapshot(capacity=2)
    for name in ("a", "b", "c"):
        snapshot.store(row(name), snapshot.applied)
    assert [snapshot.cached(n, "alice") is not None for n in ("a", "b", "c")] == [False, True, True]


def test_a_fence_while_down_proves_nothing():
    snapshot = up_snapshot()
    snapshot.up = False
    assert asyncio.run(snapshot.fence()) is False


# Against Postgres: the trigger, the listener, the fence ---------------------------------

trigger_migration = importlib.import_module("mcptasks.migrations.0010_task_change_notify")


def on_postgres(test: Callable[..., None]) -> Callable[..., None]:
    return pytest.mark.django_db(transaction=True)(postgres_only.POLL_SNAPSHOT(test))


def run_on_loop(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """``scenario`` on one event loop (the snapshot lives as long as its loop)."""

    async def main() -> Any:
        try:
            return await scenario()
        finally:
            poll_snapshot.close_all()

    return asyncio.run(main())


async def listening() -> poll_snapshot.Snapshot:
    snapshot = poll_snapshot.current()
    assert snapshot is not None
    await until(lambda: snapshot.up, "the listener never listened")
    return snapshot


async def until(condition: Callable[[], bool], message: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.01)


def change(task_id: str, **values: Any) -> Awaitable[int]:
    """A committed UPDATE of the task, from another connection."""
    return asyncio.to_thread(lambda: Task.objects.filter(pk=task_id).update(**values))


@on_postgres
def test_the_trigger_watches_every_column_a_poll_reads():
    polled = {Task._meta.get_field(name).column for name in task_reads.LOOKUP_FIELDS}
    assert polled == set(trigger_migration.POLLED_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass", [Task._meta.db_table])
        names = {name for (name,) in cursor.fetchall()}
    assert {"mcptasks_task_changed_update", "mcptasks_task_changed_delete"} <= names


@on_postgres
def test_the_migration_reverses_and_reapplies():
    from django.apps import apps as django_apps

    def triggers() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass", [Task._meta.db_table])
            return {name for (name,) in cursor.fetchall() if name.startswith("mcptasks_task_changed")}

    with connection.schema_editor() as editor:
        trigger_migration.drop_trigger(django_apps, editor)
    assert triggers() == set()
    with connection.schema_editor() as editor:
        trigger_migration.create_trigger(django_apps, editor)
    assert triggers() == {"mcptasks_task_changed_update", "mcptasks_task_changed_delete"}


@on_postgres
def test_a_committed_change_drops_the_row():
    task = running_task()

    async def scenario() -> tuple[bool, bool, bool]:
        snapshot = await listening()
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        assert snapshot.cached(task.id, task.owner) is None, "a task polled once is not kept"
        await change(task.id, status_message="unwatched", updated_at=timezone.now())
        assert await snapshot.fence() and snapshot.counts.invalidated == 0, "a task nobody keeps is silent"
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)  # marks it
        assert await asyncio.to_thread(lambda: Task.objects.filter(pk=task.id, snapshot_watched=True).exists())
        assert snapshot.cached(task.id, task.owner) is None, "a row read before the mark is not kept"
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        kept = snapshot.cached(task.id, task.owner) is not None
        await change(task.id, lease_expires_at=timezone.now() + timedelta(minutes=5))  # not polled
        await change(task.id, status_message="half way", updated_at=timezone.now())
        await until(lambda: snapshot.cached(task.id, task.owner) is None, "the change never arrived")
        fresh = await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        assert fresh is not None and fresh.status_message == "half way"
        await asyncio.to_thread(lambda: Task.objects.filter(pk=task.id).delete())
        await until(lambda: snapshot.cached(task.id, task.owner) is None, "the delete never arrived")
        gone = await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        return kept, snapshot.counts.invalidated == 2, gone is None

    assert run_on_loop(scenario) == (True, True, True), "a lease renewal is silent; a change and a delete are not"


@on_postgres
def test_a_read_finished_task_is_served_without_a_read():
    task = completed_task()
    Task.objects.filter(pk=task.id).update(outcome_read_at=timezone.now())
    reads: list[str] = []

    async def counted(task_id: str, owner: str) -> Task | None:
        reads.append(task_id)
        return await task_reads.alookup(task_id, owner)

    async def scenario() -> list[str | None]:
        await listening()
        answers = [await poll_snapshot.lookup(task.id, task.owner, counted) for _ in range(5)]
        foreign = await poll_snapshot.lookup(task.id, "mallory", counted)
        assert foreign is None, "another caller never gets the task"
        return [a.status if a else None for a in answers]

    assert run_on_loop(scenario) == ["completed"] * 5
    assert reads == [task.id] * 4, "three reads for the owner (the second marks, the third keeps), one foreign"


@on_postgres
def test_a_first_outcome_read_and_a_waiting_task_are_never_kept():
    unread, waiting = completed_task(), waiting_task()

    async def scenario() -> int:
        snapshot = await listening()
        for task in (unread, waiting, unread, waiting):
            await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        return snapshot.counts.served

    assert run_on_loop(scenario) == 0


@on_postgres
def test_a_reconnect_flushes_and_nothing_is_served_while_down():
    task = running_task()

    async def scenario() -> None:
        snapshot = await listening()
        for _ in range(3):
            await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        assert snapshot.cached(task.id, task.owner) is not None
        flushes = snapshot.counts.flushes
        pid = snapshot.connections[0].pgconn.backend_pid
        await asyncio.to_thread(_terminate, pid)
        await until(lambda: not snapshot.up, "the listener never noticed")
        assert snapshot.cached(task.id, task.owner) is None
        served = snapshot.counts.served
        assert (await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)) is not None
        assert snapshot.counts.served == served, "served while down"
        assert snapshot.cached(task.id, task.owner) is None, "kept while down"
        await until(lambda: snapshot.up, "the listener never reconnected")
        assert snapshot.counts.flushes > flushes
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        assert (await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)) is not None
        assert snapshot.counts.served == served + 1

    run_on_loop(scenario)


def _terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


@on_postgres
def test_the_setting_off_reads_every_poll(settings):
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_SNAPSHOT": False}
    task = completed_task()
    Task.objects.filter(pk=task.id).update(outcome_read_at=timezone.now())
    reads: list[str] = []

    async def counted(task_id: str, owner: str) -> Task | None:
        reads.append(task_id)
        return await task_reads.alookup(task_id, owner)

    async def scenario() -> tuple[Any, Any]:
        for _ in range(3):
            await poll_snapshot.lookup(task.id, task.owner, counted)
        return poll_snapshot.current(), poll_snapshot.stats()

    assert run_on_loop(scenario) == (None, None), "no snapshot and no listener"
    assert reads == [task.id] * 3


@on_postgres
def test_polls_through_the_route_see_a_change_at_once(settings, redis_poll_throttle):
    settings.MCPTASKS = {**settings.MCPTASKS, "POLL_BURST": None}
    app = mcp_router(get_asgi_application(), path="/mcp")

    async def send(method: str, params: dict[str, Any]) -> dict[str, Any]:
        params = {**params, "_meta": build_meta()}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        status, _, raw = await apost(app, body, build_headers(method, params))
        assert status == 200, raw
        return json.loads(raw)["result"]

    async def scenario() -> None:
        snapshot = await listening()
        created = await send("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}})
        task_id = created["taskId"]
        for _ in range(5):
            assert (await send("tasks/get", {"taskId": task_id}))["status"] == "working"
        assert snapshot.counts.served >= 2, "polls of an unchanged task were read"
        await change(task_id, status_message="almost", updated_at=timezone.now())
        assert (await send("tasks/get", {"taskId": task_id})).get("statusMessage") == "almost"

    run_on_loop(scenario)


@on_postgres
def test_no_poll_is_older_than_a_change_committed_before_it():
    """The fence: a writer commits changes while pollers poll; each poll
    notes the last change committed before it was sent, and its answer is
    never older."""
    task = running_task()
    committed = [0]
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            Task.objects.filter(pk=task.id).update(status_message=str(n), updated_at=datetime.now(UTC))
            committed[0] = n  # only once the change is committed
            time.sleep(0.002 if n % 10 else 0.25)  # bursts, and pauses the snapshot can serve in
        connection.close()

    async def poller(deadline: float) -> int:
        polls = 0
        while time.monotonic() < deadline:
            before = committed[0]
            answer = await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
            assert answer is not None
            seen = int(answer.status_message or 0)
            assert seen >= before, f"a poll sent after change {before} answered change {seen}"
            polls += 1
        return polls

    async def scenario() -> tuple[int, poll_snapshot.Stats]:
        snapshot = await listening()
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            deadline = time.monotonic() + 6.0
            counts = await asyncio.gather(*(poller(deadline) for _ in range(8)))
        finally:
            stop.set()
            await asyncio.to_thread(thread.join)
        return sum(counts), snapshot.counts

    polls, stats = run_on_loop(scenario)
    assert committed[0] > 20, "the writer hardly wrote"
    assert stats.served > 0 and stats.read > 0, f"the race never exercised both paths: {stats}"
    assert stats.fences > 0 and polls == stats.served + stats.read


@on_postgres
def test_concurrent_polls_mark_a_task_once():
    task = running_task()

    async def scenario() -> tuple[int, bool]:
        snapshot = await listening()
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)  # polled once: not marked
        assert snapshot.counts.marked == 0
        await asyncio.gather(*(poll_snapshot.lookup(task.id, task.owner, task_reads.alookup) for _ in range(8)))
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        return snapshot.counts.marked, snapshot.cached(task.id, task.owner) is not None

    assert run_on_loop(scenario) == (1, True)


@on_postgres
def test_a_task_whose_second_poll_reads_its_outcome_first_is_not_marked():
    """A client that polls a running task once and then reads its outcome
    (the common case) leaves it unwatched: its changes stay silent."""
    task = running_task()

    async def scenario() -> int:
        snapshot = await listening()
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)
        await asyncio.to_thread(lambda: Task.objects.filter(pk=task.id).update(status=TaskStatus.COMPLETED))
        await poll_snapshot.lookup(task.id, task.owner, task_reads.alookup)  # the outcome, not yet read
        return snapshot.counts.marked

    assert run_on_loop(scenario) == 0
    assert not Task.objects.get(pk=task.id).snapshot_watched


@postgres_only.POLL_SNAPSHOT
def test_no_snapshot_where_the_loop_cannot_take_the_sites_role(monkeypatch):
    """With ``assume_role`` in ``OPTIONS`` the loop's own connections could
    not take the role (the store awaits its steps on a thread), so no
    snapshot connects or marks a task as the login role."""
    options = {**connection.settings_dict.get("OPTIONS", {}), "assume_role": "mcptasks_site"}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)

    async def snapshot() -> Any:
        return poll_snapshot.current()

    assert asyncio.run(snapshot()) is None
