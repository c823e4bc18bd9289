"""The poll's task read on the event loop (async psycopg), beside its
synchronous twin ``Task.objects.lookup``: the same statement and the same row
decoding, so one rule has one home.

A poll served this way holds no thread. Each event loop keeps a small pool of
its own connections, opened from ``DATABASES`` for the alias the task manager
reads from, in autocommit (one SELECT: no transaction to keep). Only Postgres
is read here; on any other backend, and whenever the database fails (a
connection lost to a restart, say), :class:`NotOnLoop` sends the request to
the thread path, which answers exactly as it always has (a 503 while the
database is down). The failed connection is dropped, so the next poll
reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any

from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver

from ..conf import settings
from ..models import Task


class NotOnLoop(Exception):
    """This request cannot be served on the event loop: take the thread path."""


def available() -> bool:
    """Whether the task store can be read on the loop (Postgres, no role to assume)."""
    connection = connections[Task.objects.db]
    return connection.vendor == "postgresql" and "assume_role" not in connection.settings_dict.get("OPTIONS", {})


class _Pool:
    """Idle connections of one event loop, at most ``size`` open at once, each
    kept no longer than the alias's ``CONN_MAX_AGE`` (as Django keeps its own)."""

    def __init__(self, alias: str, size: int) -> None:
        connection = connections[alias]
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)  # Django's is synchronous
        self.params = params
        self.max_age: float | None = connection.settings_dict.get("CONN_MAX_AGE", 0)
        self.idle: list[tuple[Any, float]] = []
        self.slots = asyncio.Semaphore(max(1, size))

    async def fetchone(self, sql: str, args: list[Any]) -> Any:
        import psycopg

        async with self.slots:
            conn, opened = self.idle.pop() if self.idle else (None, 0.0)
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
                    opened = time.monotonic()
                async with conn.cursor() as cursor:
                    await cursor.execute(sql, args)
                    row = await cursor.fetchone()
            except psycopg.Error as exc:
                if conn is not None:
                    _finish(conn)
                raise NotOnLoop("the task store failed on the event loop") from exc
            if self.max_age is not None and time.monotonic() - opened >= self.max_age:
                _finish(conn)  # past CONN_MAX_AGE (0: a connection per poll, as Django would)
            else:
                self.idle.append((conn, opened))
            return row

    def close(self) -> None:
        while self.idle:
            _finish(self.idle.pop()[0])


def _finish(conn: Any) -> None:
    """Close a connection without awaiting (its loop may be gone)."""
    with contextlib.suppress(Exception):  # already closed
        conn.pgconn.finish()


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        for other in [other for other in list(_pools) if other.is_closed()]:
            _pools.pop(other).close()  # a loop that ended (tests run one per request)
        pool = _pools[loop] = _Pool(Task.objects.db, settings.POLL_CONNECTIONS)
    return pool


async def lookup(task_id: str, owner: str) -> Task | None:
    """``Task.objects.lookup`` on the event loop; ``NotOnLoop`` when it cannot be."""
    manager = Task.objects
    row = await _pool().fetchone(manager.lookup_sql(connections[manager.db]), [task_id, owner])
    if row is None:
        return None
    return manager.from_row(manager.lookup_fields(), row)


def close_pools() -> None:
    """Close every loop's idle connections (at shutdown, and between tests)."""
    for loop in list(_pools):
        _pools.pop(loop).close()


@receiver(setting_changed)
def _forget_pools(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DATABASES", "MCPTASKS"):
        close_pools()
