"""Shared fixtures.

The suite runs on real services: Postgres for the database (``tests.settings``
defaults ``DATABASE_URL`` to the local server; pytest-django creates
``test_<name>_<pid>`` on it), Redis for the live stack's broker
(``MCPTASKS_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/0``).

With a ``sqlite://`` ``DATABASE_URL`` it runs on the embedded default's
database instead (the SQLite pass of bin/test): tests marked
``postgres_only(reason=...)`` are skipped there, with their reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import postgres_only
from tests.support.rpc import DjangoRpc, HttpRpc


def database_vendor() -> str:
    """``postgresql`` or ``sqlite``: the engine this run's tests use."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" in engine:
        return "postgresql"
    if engine == "django.db.backends.sqlite3":
        return "sqlite"
    raise pytest.UsageError(f"the suite runs on Postgres or SQLite, but the database engine is {engine}")


def pytest_configure(config: pytest.Config) -> None:
    vendor = database_vendor()
    if not hasattr(config, "workerinput"):  # once per run, not per xdist worker
        if vendor == "postgresql":
            drop_stale_databases()
        else:
            remove_stale_sqlite_files()


def pytest_unconfigure(config: pytest.Config) -> None:
    from django.conf import settings

    test_name = settings.DATABASES["default"].get("TEST", {}).get("NAME")
    if database_vendor() == "sqlite" and test_name and not hasattr(config, "workerinput"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{test_name}{suffix}")


#: Fixtures that connect to Redis: a test that uses one carries the ``redis`` marker.
REDIS_FIXTURES = frozenset({"redis_poll_throttle", "redis_throttle", "broker"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On SQLite, skip the tests that need Postgres, saying why; mark the
    tests whose fixtures talk to Redis. The deployment shapes run in a pass
    of their own: left out unless ``-m`` names them."""
    if "deployments" not in (config.getoption("markexpr") or ""):
        left_out = [item for item in items if item.get_closest_marker("deployments")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("deployments")]
    on_postgres = database_vendor() == "postgresql"
    for item in items:
        if REDIS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)
        mark = item.get_closest_marker("postgres_only")
        if mark is None:
            continue
        reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: postgres_only needs a reason")
        if not on_postgres:
            item.add_marker(pytest.mark.skip(reason=f"Postgres only: {reason}"))


def drop_stale_databases() -> None:
    """Drop the per-run databases (``test_<name>_<pid>``, ``mcptasks_live_<pid>_*``)
    that runs killed before their teardown left behind: those whose process
    is gone and that nobody is connected to."""
    from django.conf import settings

    from tests.support import live

    url = os.environ["DATABASE_URL"]
    base = re.escape(settings.DATABASES["default"]["NAME"])
    pattern = re.compile(rf"^(?:test_{base}_(\d+)|mcptasks_(?:live|deploy_[a-z]+)_(\d+)_[0-9a-f]{{6}})$")
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


def remove_stale_sqlite_files() -> None:
    """Remove the SQLite test databases (and their WAL files) of runs killed
    before their teardown (tests.settings names them by the run's pid)."""
    pattern = re.compile(r"test_mcptasks_(\d+)\.sqlite3(?:-wal|-shm|-journal)?$")
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "test_mcptasks_*.sqlite3*")):
        found = pattern.search(path)
        if found and int(found.group(1)) != os.getpid() and not pid_alive(int(found.group(1))):
            with contextlib.suppress(OSError):
                os.remove(path)


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
    fail ("being accessed by other users"). SQLite has no sessions to end:
    Django removes the file (and pytest_unconfigure any WAL files left)."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(
    params=[
        pytest.param("single-statement", marks=postgres_only.SINGLE_STATEMENT),
        "orm",
    ]
)
def transition_paths(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once on each task store (claim, finish, prune):
    Postgres's single statements, and the ORM store other databases take
    (the only one on SQLite, where the first is skipped)."""
    from mcptasks.tasks import store

    if request.param == "orm":
        monkeypatch.setattr(store, "_chosen", store.Orm())
    return request.param


@pytest.fixture
def rpc(client: Any) -> DjangoRpc:
    """A modern-wire client through Django's test client (anonymous caller)."""
    return DjangoRpc(client)


@pytest.fixture(autouse=True)
def _close_loop_connections() -> Iterator[None]:
    """Polls served on an event loop keep connections per loop; the tests'
    loops end with each request, so their connections go with each test."""
    yield
    from mcptasks.tasks import sql as task_sql

    task_sql.close_pools()


@pytest.fixture
def redis_poll_throttle(settings: Any) -> Iterator[str]:
    """A Redis throttle cache of this test's own (the poll throttle on the
    event loop needs one); yields its key prefix."""
    import uuid

    import redis

    url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"mcptasks-loop-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {
        **settings.CACHES,
        "loop-throttle": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": prefix,
        },
    }
    settings.MCPTASKS = {**settings.MCPTASKS, "THROTTLE_CACHE": "loop-throttle"}
    yield prefix
    admin = redis.Redis.from_url(url)
    for key in admin.scan_iter(f"{prefix}:*"):
        admin.delete(key)
    admin.close()


@pytest.fixture
def loop_served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The statuses of the responses the ASGI route's event loop served (the
    rest went to a thread)."""
    from mcptasks.web import asgi

    served: list[int] = []
    poll_on_loop = asgi._serve_on_loop

    async def counted(scope: Any, body: bytes) -> Any:
        response = await poll_on_loop(scope, body)
        if response is not None:
            served.append(response.status_code)
        return response

    monkeypatch.setattr(asgi, "_serve_on_loop", counted)
    return served


@pytest.fixture
def identifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each time the endpoint identified a caller from its credentials (not
    from the identity cache), on either path: ``"caller"`` or the refusal's
    HTTP status."""
    from mcptasks.web import views

    seen: list[str] = []
    identify = views.authenticated_caller

    def counted(request: Any, request_id: Any = None) -> Any:
        outcome = identify(request, request_id)
        seen.append(str(getattr(outcome, "status", "caller")))
        return outcome

    monkeypatch.setattr(views, "authenticated_caller", counted)
    return seen


@pytest.fixture
def loop_runs(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Redis broker for the runs that task creations on the event loop
    publish (the tests' own broker is in-process, which the loop cannot
    reach), on a queue of this test's own; yields the queue's name."""
    import uuid

    import redis

    from mcptasks.worker import messages

    url = os.environ.get("MCPTASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    queue = f"mcptasks-loop-runs-{uuid.uuid4().hex[:8]}"
    settings.MCPTASKS = {**settings.MCPTASKS, "CELERY_QUEUE": queue}
    monkeypatch.setattr(messages, "_broker_url", lambda: url)
    yield queue
    redis.Redis.from_url(url).delete(queue)


@pytest.fixture(params=["thread", "loop"])
def poll_rpc(request: Any, rpc: DjangoRpc, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A modern-wire client for tests of the task methods and task creation,
    once per path they can take: Django's request on a worker thread
    (``rpc``), and the ASGI route's event loop (its runs published to Redis,
    ``loop_runs``), which must then have served the test's polls."""
    if request.param == "thread":
        yield rpc
        return
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip(postgres_only.LOOP_POLLS_REASON)
    request.getfixturevalue("redis_poll_throttle")
    request.getfixturevalue("loop_runs")
    from tests.support.asgi import AsgiRpc

    served = request.getfixturevalue("loop_served")
    client = AsgiRpc()
    client.request("server/discover")  # identifies the caller once, on a thread
    polls = client.polls_sent
    yield client
    if client.polls_sent > polls:
        assert served, "no tasks/get was served on the event loop"


@pytest.fixture
def temp_tool() -> Iterator[Any]:
    """``@temp_tool(**options)`` (or bare ``@temp_tool``): register a tool
    for one test in the global registry, the one runs and requests use; it
    is unregistered after the test."""
    from mcptasks.tools.registry import registry, tool

    names: list[str] = []

    def register(fn: Any = None, **options: Any) -> Any:
        def decorate(func: Any) -> Any:
            tool(func, **options)
            names.append(options.get("name") or func.__name__)
            return func

        return decorate(fn) if fn is not None else decorate

    try:
        yield register
    finally:
        for name in names:
            registry.unregister(name)


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


@pytest.fixture
def token_for(django_user_model: Any) -> Any:
    """``token_for(username) -> str``: a new user and its DRF token key."""
    from rest_framework.authtoken.models import Token

    def make(username: str) -> str:
        user = django_user_model.objects.create(username=username)
        return Token.objects.create(user=user).key

    return make


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


# The chaos tests' servers --------------------------------------------------------------------


@pytest.fixture(scope="session")
def private_services() -> Iterator[Any]:
    """A Postgres cluster and a Redis server of our own, for the chaos
    stacks (tests/reliability/stack.py); stopped at the end."""
    from tests.reliability.services import ServiceUnavailable, acquire_services, release_services

    try:
        services = acquire_services()
    except ServiceUnavailable as exc:
        pytest.skip(f"cannot run private services: {exc}")
    try:
        yield services
    finally:
        release_services()
