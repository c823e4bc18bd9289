"""The raw statements (``queries.sql``; off the hot path ``controls.sql``, ``maintenance.sql``, ``overview.sql``),
each under its name, run on Postgres prepared server-side: :func:`execute` on the thread's Django
connection, :func:`aexecute` on the loop's own small pool, in autocommit. ORM forms: ``store.orm``."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from django.core.signals import setting_changed
from django.db import connection, connections, models
from django.dispatch import receiver

from ..conf import settings
from ..models import Task

_PREPARABLE = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def _load(paths: Iterable[Path]) -> dict[str, str]:
    """The statements of ``-- name:`` files, their comment and blank lines left out."""
    statements: dict[str, str] = {}
    for path in paths:
        for block in re.split(r"^-- name: ", path.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
            name, *lines = block.splitlines()
            if name.strip() in statements:
                raise ValueError(f"statement {name.strip()!r} is named twice")
            kept = [line for line in lines if line.strip() and not line.lstrip().startswith("--")]
            statements[name.strip()] = "\n".join(kept).rstrip().rstrip(";")
    return statements


#: Every raw statement, by name.
STATEMENTS: dict[str, str] = _load(sorted(Path(__file__).parent.glob("*.sql")))
#: The parameters each names: only these are passed, as psycopg keeps a statement's parsing for at most 50.
_NAMED = {name: tuple(dict.fromkeys(re.findall(r"%\((\w+)\)[sbt]", text))) for name, text in STATEMENTS.items()}


def _bound(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {key: params[key] for key in _NAMED[name]}


#: psycopg prepares when asked or after this many runs: never, so only ours are prepared.
_ONLY_WHEN_ASKED = sys.maxsize


def _prepare(text: str, max_age: float | None) -> bool:
    """Prepare only what Postgres can, on a connection kept past its request (``CONN_MAX_AGE``)."""
    return settings.PREPARE_STATEMENTS and max_age != 0 and bool(_PREPARABLE.match(text))


def execute(name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Run ``name`` on the thread's connection; a psycopg cursor (Django's binds client-side), rows unread."""
    import psycopg

    text = STATEMENTS[name]
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _ONLY_WHEN_ASKED  # Django's default: never
    bound, prepare = _bound(name, params or {}), _prepare(text, connection.settings_dict.get("CONN_MAX_AGE", 0))
    started = time.monotonic()
    with connection.wrap_database_errors:
        cursor = psycopg.Cursor(raw)
        cursor.execute(text, bound, prepare=prepare)
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": f"-- {name}\n{text}", "time": f"{time.monotonic() - started:.3f}", "params": params}
        )
    return cursor


def column_names(cursor: Any) -> list[str]:
    """The result's column names, from libpq (``description`` builds an object per column, per read)."""
    result = cursor.pgresult
    return [] if result is None else [(result.fname(i) or b"").decode() for i in range(result.nfields)]


def db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """``value`` as a parameter for ``model.field``, as the ORM would save it."""
    target = model._meta.get_field(field)
    assert isinstance(target, models.Field)
    return target.get_db_prep_save(value, connection)


class Result(NamedTuple):
    """A statement's result on the loop: column names, rows, rows affected."""

    names: list[str]
    rows: list[Any]
    rowcount: int

    def first(self) -> Any:
        return self.rows[0] if self.rows else None


class Session(NamedTuple):
    """A connection of the loop's pool, lent for one statement or one transaction."""

    conn: Any
    max_age: float | None

    async def execute(self, name: str, params: Mapping[str, Any]) -> Result:
        import psycopg

        text = STATEMENTS[name]
        async with psycopg.AsyncCursor(self.conn) as cursor:
            await cursor.execute(text, _bound(name, params), prepare=_prepare(text, self.max_age))
            names = column_names(cursor)
            return Result(names, await cursor.fetchall() if names else [], cursor.rowcount)


class NotOnLoop(Exception):
    """The task store failed on the event loop: answered as an outage (503), not retried on a thread."""


def loop_available() -> bool:
    """Whether the task store can be reached on the loop (Postgres, no role to assume)."""
    conn = connections[Task.objects.db]
    return conn.vendor == "postgresql" and "assume_role" not in conn.settings_dict.get("OPTIONS", {})


#: ``application_name`` of the loop's connections (unless ``OPTIONS`` name one), for pg_stat_activity.
LOOP_APPLICATION_NAME = "mcptasks event loop"


class _Pool:
    """One loop's connections for the task manager's alias, in autocommit: at most ``size``
    open, each kept no longer than ``CONN_MAX_AGE``, dropped when the database fails."""

    def __init__(self, alias: str, size: int) -> None:
        conn = connections[alias]
        params = conn.get_connection_params()
        params.pop("cursor_factory", None)  # Django's is synchronous and binds client-side
        params.setdefault("application_name", LOOP_APPLICATION_NAME)
        if params.get("prepare_threshold") is None:
            params["prepare_threshold"] = _ONLY_WHEN_ASKED
        self.params = params
        self.max_age: float | None = conn.settings_dict.get("CONN_MAX_AGE", 0)
        self.idle: list[tuple[Any, float]] = []
        self.slots = asyncio.Semaphore(max(1, size))

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        import psycopg

        async with self.slots:
            conn, opened = self.idle.pop() if self.idle else (None, 0.0)
            failed = False
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
                    opened = time.monotonic()
                yield Session(conn, self.max_age)
            except psycopg.Error as exc:
                failed = True
                raise NotOnLoop("the task store failed on the event loop") from exc
            finally:
                # Kept unless the database failed, a transaction was left open (a cancelled
                # request), or it is past CONN_MAX_AGE (0: one per call, as Django would).
                if conn is not None:
                    idle = not failed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                    if idle and (self.max_age is None or time.monotonic() - opened < self.max_age):
                        self.idle.append((conn, opened))
                    else:
                        _finish(conn)

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
    """Run ``name`` on the loop's pool, committed when this returns (``NotOnLoop`` if the database fails)."""
    async with _pool().session() as session:
        return await session.execute(name, params)


@contextlib.asynccontextmanager
async def atransaction() -> AsyncIterator[Session]:
    """One transaction on the loop's pool, for statements that need a row lock's fresh snapshot."""
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
