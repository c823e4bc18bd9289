"""Shared fixtures.

The suite runs on real services: Postgres for the database (``tests.settings``
defaults ``DATABASE_URL`` to the local server; pytest-django creates
``test_<name>`` on it), Redis for the live stack's broker
(``MCPTASKS_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.rpc import DjangoRpc, HttpRpc


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine:
        raise pytest.UsageError(f"the suite needs Postgres, but the database engine is {engine}")
    if not hasattr(config, "workerinput"):  # once per run, not per xdist worker
        drop_stale_databases()


def drop_stale_databases() -> None:
    """Drop the per-run databases (``test_<name>_<pid>``, ``mcptasks_live_<pid>_*``)
    that runs killed before their teardown left behind: those whose process
    is gone and that nobody is connected to."""
    from django.conf import settings

    from tests.support import live

    url = os.environ["DATABASE_URL"]
    base = re.escape(settings.DATABASES["default"]["NAME"])
    pattern = re.compile(rf"^(?:test_{base}_(\d+)|mcptasks_live_(\d+)_[0-9a-f]{{6}})$")
    try:
        with live.admin_connect(url) as conn:
            names = [row[0] for row in conn.execute("SELECT datname FROM pg_database")]
            for name in names:
                found = pattern.match(name)
                if not found:
                    continue
                pid = int(found.group(1) or found.group(2))
                if pid == os.getpid() or pid_alive(pid):
                    continue
                with contextlib.suppress(Exception):  # in use after all: leave it
                    conn.execute(f'DROP DATABASE "{name}"')
    except Exception as exc:  # the suite reports an unreachable database itself
        print(f"could not look for stale test databases: {exc}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# In-process fixtures -------------------------------------------------------------------


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, plus: before it is dropped, end the
    other sessions on it. The endpoint does its database work on its own
    threads, whose connections would otherwise stay open and make the drop
    fail ("being accessed by other users")."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(params=["single-statement", "orm"])
def transition_paths(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once on each path of the domain's raw statements
    (claim, finish, purge): Postgres's single statements, and the ORM path
    other databases take."""
    from mcptasks.tasks import sql

    if request.param == "orm":
        monkeypatch.setattr(sql, "single_statement", lambda: False)
    return request.param


@pytest.fixture
def rpc(client: Any) -> DjangoRpc:
    """A modern-wire client through Django's test client (anonymous caller)."""
    return DjangoRpc(client)


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """Every Celery message published while the test runs (name, args, queue),
    recorded by Celery's own ``after_task_publish`` signal."""
    from celery.signals import after_task_publish

    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def record(sender: str | None = None, headers: Any = None, body: Any = None, routing_key: Any = None, **_: Any):
        args = body[0] if isinstance(body, (list, tuple)) and body else None
        with lock:
            seen.append({"task": sender, "args": list(args or []), "routing_key": routing_key})

    after_task_publish.connect(record, weak=False)
    try:
        yield seen
    finally:
        after_task_publish.disconnect(record)


# The live stack ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Postgres database + uvicorn + Celery worker on Redis, for the session."""
    from tests.support import live

    # A SIGTERM (a CI timeout, say) becomes an interrupt, so the processes
    # and the database are still torn down.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    log_dir = tmp_path_factory.mktemp("live-stack")
    stack = live.start_stack(log_dir)
    try:
        # The whole path works (web -> broker -> worker -> database) before any test uses it.
        warm = HttpRpc(stack.url)
        try:
            task_id = warm.create_task("slow_compute", {"seconds": 0, "label": "warm-up"})
            final = warm.wait_for(task_id, timeout=90)
            assert final["status"] == "completed", final
        except AssertionError as exc:
            raise RuntimeError(f"live stack did not run a task: {exc}\n{stack.logs()}") from exc
        finally:
            warm.close()
        yield stack
    finally:
        live.teardown_stack(stack)
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def live(live_stack: Any) -> Iterator[HttpRpc]:
    """An anonymous HTTP client for the live stack."""
    client = HttpRpc(live_stack.url)
    try:
        yield client
    finally:
        client.close()
