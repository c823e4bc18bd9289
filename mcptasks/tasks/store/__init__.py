"""The task store: where the operations of ``creation``, ``runs``,
``transitions``, ``reads``, ``maintenance`` and ``slots`` write and read.

One backend per process, chosen on first use from the database of Django's
connection (again only when ``DATABASES`` changes, as in tests), so each
transition has one writer in a process: on Postgres ``postgres.Postgres``
(every write the operation's named statement in ``queries.sql``), on every
other database ``orm.Orm``. The operation modules keep the rules (which
status may move to which), the public API and the sequence; the store does
the write, and announces it as its backend knows the row. Both serve the
async forms: Postgres's on the event loop's own connections (on a thread
where a role is to be assumed), the ORM's by awaiting the same operation on
a thread.
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.db import connection
from django.dispatch import receiver

from .orm import Orm
from .postgres import Postgres

_chosen: Postgres | Orm | None = None


def backend() -> Postgres | Orm:
    """The process's store (``name``: ``"postgres"`` or ``"orm"``)."""
    global _chosen
    if _chosen is None:
        _chosen = Postgres() if connection.vendor == "postgresql" else Orm()
    return _chosen


def on_postgres() -> bool:
    """Whether the process's store is Postgres's statements (reads that have a statement of their own follow it)."""
    return backend().name == "postgres"


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    global _chosen
    if setting == "DATABASES":
        _chosen = None
