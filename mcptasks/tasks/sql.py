"""The one home of the raw statements: ``queries.sql`` holds them, each under
its name, and this module runs them on Postgres, prepared server-side.

Each statement is one named operation's Postgres implementation, called by
the Postgres store (``store.postgres``); its ORM form, for every other
database, is the ORM store's (``store.orm``), and the tests run both (the
``transition_paths`` fixture).

Two ways to run a statement, one text:

- :func:`execute`, on Django's connection of the thread (in the caller's
  transaction, or in autocommit), through a server-binding cursor, since
  Django's own binds client-side and so can never prepare;
- :func:`aexecute`, on the event loop, from a small pool of async
  connections of the loop's own, in autocommit.

Both prepare the statement on first use on each connection that outlives
its request (``PREPARE_STATEMENTS``; ``CONN_MAX_AGE`` not 0), so Postgres
parses and plans it once per connection rather than on every call. A statement Postgres cannot prepare
(a utility like ``LOCK``) runs unprepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from django.core.signals import setting_changed
from django.db import connection, connections, models
from django.dispatch import receiver

from ..conf import settings
from ..models import Task

_NAME = re.compile(r"^-- name: (\w+)\s*$")
_PREPARABLE = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def _load(path: Path) -> dict[str, str]:
    """The statements of a ``-- name:`` file, their comment lines left out."""
    statements: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        named = _NAME.match(line)
        if named:
            if named.group(1) in statements:
                raise ValueError(f"statement {named.group(1)!r} is named twice in {path.name}")
            current = statements[named.group(1)] = []
        elif current is not None and not line.lstrip().startswith("--") and line.strip():
            current.append(line)
    return {name: "\n".join(lines).rstrip().rstrip(";") for name, lines in statements.items()}


#: Every raw statement, by name.
STATEMENTS: dict[str, str] = _load(Path(__file__).with_name("queries.sql"))

#: psycopg prepares a statement when asked (``prepare=True``) or after this
#: many runs: an unreachable count, so only the statements here are prepared.
_ONLY_WHEN_ASKED = sys.maxsize


def _prepare(text: str, max_age: float | None) -> bool:
    """Whether to prepare: only a statement Postgres can prepare, and only on
    a connection kept past its request (``CONN_MAX_AGE`` not 0), where the
    round trip that prepares it is paid once, not on every use."""
    return settings.PREPARE_STATEMENTS and max_age != 0 and bool(_PREPARABLE.match(text))


def execute(name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Run the statement ``name`` on the thread's Django connection (default
    alias) and return its psycopg cursor, rows unread."""
    import psycopg

    text = STATEMENTS[name]
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _ONLY_WHEN_ASKED  # Django's default: never
    started = time.monotonic()
    with connection.wrap_database_errors:
        cursor = psycopg.Cursor(raw)
        cursor.execute(text, params or {}, prepare=_prepare(text, connection.settings_dict.get("CONN_MAX_AGE", 0)))
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": f"-- {name}\n{text}", "time": f"{time.monotonic() - started:.3f}", "params": params}
        )
    return cursor


def column_names(cursor: Any) -> list[str]:
    """The names of a cursor's result columns, in order."""
    return [column.name for column in cursor.description]


def db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """``value`` as a raw statement's parameter for ``model.field`` (JSON
    wrapped for the driver, and so on), as the ORM would save it."""
    target = model._meta.get_field(field)
    assert isinstance(target, models.Field)
    return target.get_db_prep_save(value, connection)


def strings(values: Sequence[str]) -> list[str]:
    """Choices as plain strings, for an array parameter."""
    return [str(value) for value in values]


# The event loop's connections -----------------------------------------------------


class Result(NamedTuple):
    """A statement's result on the loop: column names, rows, rows affected."""

    names: list[str]
    rows: list[Any]
    rowcount: int

    def first(self) -> Any:
        return self.rows[0] if self.rows else None


class Session:
    """A connection of the loop's pool, lent for one operation."""

    def __init__(self, conn: Any, max_age: float | None) -> None:
        self.conn = conn
        self.max_age = max_age

    async def execute(self, name: str, params: Mapping[str, Any]) -> Result:
        """Run the statement ``name`` (prepared where ``_prepare`` says)."""
        import psycopg

        text = STATEMENTS[name]
        async with psycopg.AsyncCursor(self.conn) as cursor:
            await cursor.execute(text, params, prepare=_prepare(text, self.max_age))
            described = cursor.description is not None
            return Result(
                column_names(cursor) if described else [],
                await cursor.fetchall() if described else [],
                cursor.rowcount,
            )


class NotOnLoop(Exception):
    """The task store cannot be reached on the event loop (its database
    failed there, or it has a role to assume); the request is answered as an
    outage (503), never served again on a thread."""


def loop_available() -> bool:
    """Whether the task store can be reached on the loop (Postgres, no role to assume)."""
    conn = connections[Task.objects.db]
    return conn.vendor == "postgresql" and "assume_role" not in conn.settings_dict.get("OPTIONS", {})


#: ``application_name`` of the event loop's connections (unless the site's
#: ``OPTIONS`` name one).
LOOP_APPLICATION_NAME = "mcptasks event loop"


class _Pool:
    """Idle connections of one event loop, at most ``size`` open at once, each
    kept no longer than the alias's ``CONN_MAX_AGE`` (as Django keeps its own).

    Opened from ``DATABASES`` for the alias the task manager uses, in
    autocommit: each operation on the loop is one statement. When the
    database fails (a connection lost to a restart, say), the connection is
    dropped, so the next call reconnects, and :class:`NotOnLoop` answers
    the request as the thread path would (a 503 while the database is down).
    """

    def __init__(self, alias: str, size: int) -> None:
        conn = connections[alias]
        params = conn.get_connection_params()
        params.pop("cursor_factory", None)  # Django's is synchronous and binds client-side
        # Named, so pg_stat_activity tells the loop's connections from the threads'.
        params.setdefault("application_name", LOOP_APPLICATION_NAME)
        if params.get("prepare_threshold") is None:
            params["prepare_threshold"] = _ONLY_WHEN_ASKED
        self.params = params
        self.max_age: float | None = conn.settings_dict.get("CONN_MAX_AGE", 0)
        self.idle: list[tuple[Any, float]] = []
        self.slots = asyncio.Semaphore(max(1, size))

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """One of the pool's connections, for one statement or one transaction."""
        import psycopg

        async with self.slots:
            conn, opened = self.idle.pop() if self.idle else (None, 0.0)
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
                    opened = time.monotonic()
                yield Session(conn, self.max_age)
            except psycopg.Error as exc:
                if conn is not None:
                    _finish(conn)
                raise NotOnLoop("the task store failed on the event loop") from exc
            except BaseException:
                # Not the database's failure (a refused answer, a cancelled
                # request): the connection is kept if its transaction ended.
                if conn is not None and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    _finish(conn)
                elif conn is not None:
                    self._give_back(conn, opened)
                raise
            self._give_back(conn, opened)

    def _give_back(self, conn: Any, opened: float) -> None:
        if self.max_age is not None and time.monotonic() - opened >= self.max_age:
            _finish(conn)  # past CONN_MAX_AGE (0: a connection per call, as Django would)
        else:
            self.idle.append((conn, opened))

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


async def aexecute(name: str, params: Mapping[str, Any]) -> Result:
    """Run the statement ``name`` on the running loop's pool, in autocommit
    (committed when this returns). ``NotOnLoop`` when the database fails."""
    async with _pool().session() as session:
        return await session.execute(name, params)


@contextlib.asynccontextmanager
async def atransaction() -> AsyncIterator[Session]:
    """One transaction on the running loop's pool, committed when the block
    ends and rolled back if it raises (``NotOnLoop`` when the database
    fails). For an operation whose later statements need a row lock's fresh
    snapshot, which one statement cannot have."""
    async with _pool().session() as session, session.conn.transaction():
        yield session


def close_pools() -> None:
    """Close every loop's idle connections (at shutdown, and between tests)."""
    for loop in list(_pools):
        _pools.pop(loop).close()


@receiver(setting_changed)
def _forget_pools(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DATABASES", "MCPTASKS"):
        close_pools()
