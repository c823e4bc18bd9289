"""What the raw statements (Postgres) share: when to use them, the quoted
tables and columns, and parameters prepared as the ORM would save them.

Each raw statement sits beside its ORM twin in the module of its concern
(``creation``, ``transitions``, ``runs``, ``maintenance``); the tests run
both through the ``transition_paths`` fixture.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from django.db import connection, connections, models

from ..models import ActiveTaskCount, InputRequest, Task, TaskEvent


def single_statement() -> bool:
    """Whether the raw statements apply (Postgres).

    A run's claim and its finish are the worker's hot path. On Postgres each is
    one statement (a data-modifying CTE: the guarded UPDATE, its event, and the
    row as left), so one round trip and one implicit commit, with no ORM query
    compilation. The guard is the UPDATE's own WHERE, which Postgres re-checks
    against the newest row version after waiting for a concurrent writer: the
    same compare-and-set as ``transitions._transition``. Other databases take
    the ORM path.
    """
    return connection.vendor == "postgresql"


def task_columns() -> tuple[list[str], str]:
    """Task's field names and its quoted columns, in the same order."""
    return _task_columns(connection.alias)


@functools.cache
def _task_columns(alias: str) -> tuple[list[str], str]:
    fields = Task._meta.concrete_fields
    return [f.attname for f in fields], ", ".join(connections[alias].ops.quote_name(f.column) for f in fields)


def tables() -> dict[str, str]:
    """The app's tables, quoted for the connection in use."""
    return _tables(connection.alias)


@functools.cache
def _tables(alias: str) -> dict[str, str]:
    quote = connections[alias].ops.quote_name
    return {
        "task": quote(Task._meta.db_table),
        "event": quote(TaskEvent._meta.db_table),
        "input": quote(InputRequest._meta.db_table),
        "count": quote(ActiveTaskCount._meta.db_table),
    }


def db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """``value`` as a raw statement's parameter for ``model.field`` (JSON
    wrapped for the driver, and so on), as the ORM would save it."""
    # Each caller names a concrete field, never a relation's reverse side.
    return cast("models.Field[Any, Any]", model._meta.get_field(field)).get_db_prep_save(value, connection)


#: The event columns a raw statement writes, in this order.
EVENT_FIELDS = ("task", "at", "kind", "from_status", "to_status", "actor", "detail")


def event_columns() -> str:
    """``TaskEvent``'s columns for ``EVENT_FIELDS``, quoted, comma separated."""
    return _event_columns(connection.alias)


@functools.cache
def _event_columns(alias: str) -> str:
    quote = connections[alias].ops.quote_name
    return ", ".join(
        quote(cast("models.Field[Any, Any]", TaskEvent._meta.get_field(name)).column) for name in EVENT_FIELDS
    )
