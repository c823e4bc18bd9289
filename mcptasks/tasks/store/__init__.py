"""The task store, each transition's one writer: per process (again when ``DATABASES`` changes),
``PostgresStore`` (the ``.sql`` files' statements) on Postgres, ``orm.Orm`` on any other database."""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.db import connection
from django.dispatch import receiver

from .orm import Orm
from .postgres_off_path import PostgresStore

_chosen: PostgresStore | Orm | None = None


def backend() -> PostgresStore | Orm:
    """The process's store (``name``: ``"postgres"`` or ``"orm"``)."""
    global _chosen
    if _chosen is None:
        _chosen = PostgresStore() if connection.vendor == "postgresql" else Orm()
    return _chosen


def on_postgres() -> bool:
    return backend().name == "postgres"


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    global _chosen
    if setting == "DATABASES":
        _chosen = None
