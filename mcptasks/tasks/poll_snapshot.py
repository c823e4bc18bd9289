"""Polls of unchanged tasks answered without a database read (Postgres): each event loop keeps the rows
its polls last read and drops one when a trigger (migration 0010) notifies ``CHANNEL`` of a change to it.
When a row may be served, and why that is sound: docs/architecture.md, "Polls from the snapshot"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver

from ..conf import settings
from ..models import TERMINAL_STATUSES, Task, TaskStatus
from . import sql

logger = logging.getLogger("mcptasks.poll_snapshot")

#: The trigger's channel; the payload is the changed task's id.
CHANNEL = "mcptasks_task"
#: How long a poll waits for its fence before it reads the database instead.
FENCE_TIMEOUT_SECONDS = 1.0
RECONNECT_SECONDS = 0.5


@dataclass
class Stats:
    """What the snapshot did, for tests and the bench."""

    served: int = 0
    read: int = 0
    fences: int = 0
    invalidated: int = 0
    flushes: int = 0
    marked: int = 0


class Snapshot:
    """The poll answers of one event loop and the listener that keeps them true (all on that loop: no locks)."""

    def __init__(self, alias: str, capacity: int) -> None:
        connection = connections[alias]
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)  # Django's is synchronous
        self.params = {**params, "application_name": "mcptasks poll snapshot", "autocommit": True}
        table = connection.ops.quote_name(Task._meta.db_table)
        self.mark_sql = f"UPDATE {table} SET snapshot_watched = true WHERE id = %s AND NOT snapshot_watched"
        self.capacity = max(1, capacity)
        self.sync_channel = f"mcptasks_sync_{secrets.token_hex(8)}"
        self.rows: dict[str, Task] = {}
        self.up = False
        # Notifications applied so far; a read's token is this count when it began.
        self.applied = 0
        # Per task id, the count at its last invalidation (bounded).
        self.invalidated_at: dict[str, int] = {}
        # Rows read with a token below this may not be kept (after a flush, or a prune of ``invalidated_at``).
        self.floor = 0
        self.next_batch: asyncio.Future[bool] | None = None
        self.markers: dict[str, asyncio.Future[bool]] = {}
        self.marker_count = 0
        self.sender: asyncio.Task[None] | None = None
        self.sender_conn: Any = None
        self.listener: asyncio.Task[None] | None = None
        self.connections: list[Any] = []
        # Tasks polled once here and tasks marked watched (bounded: forgetting one costs a poll or a mark again).
        self.seen: dict[str, None] = {}
        self.marked: dict[str, None] = {}
        self.marking: dict[str, asyncio.Future[bool]] = {}
        self.counts = Stats()

    def cached(self, task_id: str, owner: str) -> Task | None:
        row = self.rows.get(task_id)
        return row if row is not None and row.owner == owner else None

    def store(self, task: Task, token: int) -> bool:
        """Keep ``task`` if it may be served and no change of it was applied since its read began (at ``token``)."""
        if not self.up or token < self.floor or self.invalidated_at.get(task.id, -1) > token or not _keepable(task):
            return False
        _remember(self.rows, task.id, task, self.capacity)
        return True

    def invalidate(self, task_id: str) -> None:
        """A committed change of ``task_id`` (in commit order)."""
        self.applied += 1
        self.counts.invalidated += 1
        self.rows.pop(task_id, None)
        self.invalidated_at[task_id] = self.applied
        if len(self.invalidated_at) > 4 * self.capacity:
            self.invalidated_at.clear()
            self.floor = self.applied

    def flush(self) -> None:
        """Forget everything, and refuse rows whose read began before now."""
        self.applied += 1
        self.counts.flushes += 1
        self.rows.clear()
        self.invalidated_at.clear()
        self.floor = self.applied

    async def fence(self) -> bool:
        """Wait until every notification committed before this call is applied; ``False`` if unknown."""
        if not self.up:
            return False
        self.counts.fences += 1
        batch = self.next_batch
        if batch is None:
            batch = self.next_batch = asyncio.get_running_loop().create_future()
            if self.sender is None or self.sender.done():
                self.sender = asyncio.ensure_future(self._send_markers())
        try:
            return await asyncio.wait_for(asyncio.shield(batch), FENCE_TIMEOUT_SECONDS)
        except TimeoutError:
            return False

    async def watch(self, task_id: str) -> None:
        """Mark a task watched (once) on its second keepable poll here: rows read after that may be kept."""
        if task_id in self.marked:
            return
        if task_id not in self.seen:
            _remember(self.seen, task_id, None, 4 * self.capacity)
            return
        marking = self.marking.get(task_id)
        if marking is None:
            marking = self.marking[task_id] = asyncio.ensure_future(self._mark(task_id))
            marking.add_done_callback(lambda _: self.marking.pop(task_id, None))
        await asyncio.shield(marking)

    async def _mark(self, task_id: str) -> bool:
        if marked := await self._send(self.mark_sql, [task_id], "mark a task"):
            self.counts.marked += 1
            _remember(self.marked, task_id, None, 4 * self.capacity)
        return marked

    async def _send(self, statement: str, params: list[str], doing: str) -> bool:
        import psycopg

        try:
            if self.sender_conn is None or self.sender_conn.closed:
                self.sender_conn = await psycopg.AsyncConnection.connect(**self.params)
            await self.sender_conn.execute(statement, params)
        except psycopg.Error:
            logger.warning("the poll snapshot could not %s", doing, exc_info=True)
            _close(self.sender_conn)
            self.sender_conn = None
            return False
        return True

    async def _listen(self) -> None:
        import psycopg

        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**self.params) as conn:
                    self.connections.append(conn)
                    await conn.execute(f"LISTEN {CHANNEL}; LISTEN {self.sync_channel}")
                    self.flush()  # every change from here on will be heard: start afresh
                    self.up = True
                    async for note in conn.notifies():
                        if note.channel == CHANNEL:
                            self.invalidate(note.payload)
                        else:
                            _settle(self.markers.pop(note.payload, None), True)
            except Exception:  # any failure: polls read the database until it is back
                logger.warning("the poll snapshot lost its listener; polls read the database", exc_info=True)
            finally:
                self.up = False
                self.flush()
                self.connections.clear()
                for waiting in [*self.markers.values(), self.next_batch]:
                    _settle(waiting, False)
                self.markers.clear()
                self.next_batch = None
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _send_markers(self) -> None:
        """Send one marker for the polls gathered so far and wait for it; again while more gathered."""
        while self.next_batch is not None and self.up:
            batch, self.next_batch = self.next_batch, None
            self.marker_count += 1
            marker = str(self.marker_count)
            self.markers[marker] = batch
            if await self._send("SELECT pg_notify(%s, %s)", [self.sync_channel, marker], "send its fence"):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(batch), FENCE_TIMEOUT_SECONDS)
            else:
                _settle(self.markers.pop(marker, None), False)

    def close(self) -> None:
        """Stop listening and close the connections without awaiting (the loop may be gone)."""
        self.up = False
        for work in (self.listener, self.sender):
            if work is not None and not work.done() and not work.get_loop().is_closed():
                work.cancel()
        for conn in [*self.connections, self.sender_conn]:
            _close(conn)


def _keepable(task: Task) -> bool:
    # Working tasks (served behind a fence); finished ones once their outcome's first read wrote its mark.
    finished = task.status in TERMINAL_STATUSES and task.outcome_read_at is not None
    return task.status == TaskStatus.WORKING or finished


def _remember(kept: dict[str, Any], key: str, value: Any, most: int) -> None:
    """Keep ``key`` last in order (evicted last), forgetting the oldest past ``most``."""
    kept.pop(key, None)
    kept[key] = value
    if len(kept) > most:
        kept.pop(next(iter(kept)))


def _settle(waiting: asyncio.Future[bool] | None, result: bool) -> None:
    if waiting is not None and not waiting.done():
        waiting.set_result(result)


def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):  # already closed
            conn.pgconn.finish()


_snapshots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Snapshot] = weakref.WeakKeyDictionary()


def current() -> Snapshot | None:
    """This event loop's snapshot, or ``None`` (setting off, or not ``sql.loop_available``)."""
    if not settings.POLL_SNAPSHOT or not sql.loop_available():
        return None
    loop = asyncio.get_running_loop()
    snapshot = _snapshots.get(loop)
    if snapshot is None:
        for other in [other for other in list(_snapshots) if other.is_closed()]:
            _snapshots.pop(other).close()  # a loop that ended (tests run one per request)
        snapshot = _snapshots[loop] = Snapshot(Task.objects.db, settings.POLL_SNAPSHOT_TASKS)
        snapshot.listener = asyncio.ensure_future(snapshot._listen())
    return snapshot


async def lookup(task_id: str, owner: str, read: Callable[[str, str], Awaitable[Task | None]]) -> Task | None:
    """The owner's task as ``read(task_id, owner)`` would give it now: from the snapshot when sound, else read."""
    snapshot = current()
    if snapshot is None:
        return await read(task_id, owner)
    row = snapshot.cached(task_id, owner)
    if row is not None and row.status not in TERMINAL_STATUSES:
        row = snapshot.cached(task_id, owner) if await snapshot.fence() else None  # what the fence left is current
    elif row is not None and row.ttl_ms is not None:
        row = row if datetime.now(UTC) < row.created_at + timedelta(milliseconds=row.ttl_ms) else None
    if row is not None:
        snapshot.counts.served += 1
        return row
    marked = task_id in snapshot.marked  # before the read: then its row may be kept
    token = snapshot.applied
    task = await read(task_id, owner)
    snapshot.counts.read += 1
    if task is not None and snapshot.up and _keepable(task):
        if marked:
            snapshot.store(task, token)
        else:
            await snapshot.watch(task_id)  # for the polls after this one
    return task


def stats() -> Stats | None:
    snapshot = _snapshots.get(asyncio.get_running_loop())
    return replace(snapshot.counts) if snapshot is not None else None


def close_all() -> None:
    """Stop every loop's listener (between tests, and when settings change)."""
    for loop in list(_snapshots):
        _snapshots.pop(loop).close()


@receiver(setting_changed)
def _forget_snapshots(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DATABASES", "MCPTASKS"):
        close_all()
