"""A real running system for end-to-end tests: a dedicated Postgres database,
a uvicorn web process and a Celery worker on Redis.

Everything is unique to the run (database name, Celery queue, worker node
name, port), so two runs on one machine do not share work. Each process gets
its own process group and the whole group is killed at teardown.

Its processes are started and stopped by the one launcher of the tests and
the bench (tests/support/processes.py); the chaos stack
(tests/reliability/stack.py) is a ``LiveStack`` with more of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

from tests.support import processes

# The launcher's helpers, which the tests use through this module.
from tests.support.processes import free_port as free_port
from tests.support.processes import kill_group as kill_group
from tests.support.processes import tail as tail
from tests.support.processes import wait_answering
from tests.support.processes import wait_ready as wait_ready

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/mcptasks"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Site:
    """What a stack's processes run: a settings module, an ASGI application
    and a Celery app."""

    settings: str
    asgi: str
    celery: str


#: The site the stacks run: the test site (tests/testapp/).
TEST_SITE = Site("tests.testapp.settings", "tests.testapp.asgi:application", "tests.testapp")
#: The example site (project/), for its own live tests in project/tests/ only
#: (tests/test_test_site.py checks that nothing under tests/ runs it).
EXAMPLE_SITE = Site("project.settings", "project.asgi:application", "project")
SITE_SETTINGS = TEST_SITE.settings
SITE_ASGI = TEST_SITE.asgi
SITE_CELERY = TEST_SITE.celery

#: Short lease and heartbeat so that recovery after a dead worker takes seconds.
LIVE_SETTINGS = {
    "MCP_LEASE_SECONDS": "3",
    "MCP_HEARTBEAT_SECONDS": "0.5",
    "MCP_DISPATCH_GRACE_SECONDS": "5",
    "MCP_MAX_ATTEMPTS": "3",
    "MCP_POLL_INTERVAL_MS": "100",
    "MCP_ALLOW_ANONYMOUS": "true",
    "MCP_LOG_LEVEL": "WARNING",
    "CONN_MAX_AGE": "0",
    # The example site's stacks: every test client signs in from 127.0.0.1, the sign-in throttle's
    # per-address count would add up across a module's tests.
    "SIGN_IN_FAILURE_LIMIT": "1000",
}

#: Variables of the calling environment that must not leak into the stack.
_SCRUB = ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "MCP_CELERY_QUEUE", "PORT", "HOST")


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def psycopg_dsn(url: str) -> str:
    """A libpq URI from a django-environ style URL (``postgres://`` or ``postgresql://``)."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, parts.fragment))


def base_env(extra: Mapping[str, str] | None = None, *, site: Site = TEST_SITE) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("MCP_")}
    env.update({"DJANGO_SETTINGS_MODULE": site.settings, "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, *, timeout: float = 60.0) -> None:
    """Until a server/discover on ``url`` answers 200 (or 401 when anonymous access is off)."""
    wait_answering(url, proc, log, ok=(200, 401), timeout=timeout)


def uvicorn_argv(
    port: int,
    app: str = SITE_ASGI,
    *,
    workers: int = 1,
    graceful_shutdown: int | None = None,
) -> list[str]:
    """The command of a web process serving ``app`` on 127.0.0.1:``port``."""
    return processes.uvicorn_argv(port, app, workers=workers, graceful_shutdown=graceful_shutdown, lifespan=False)


def celery_argv(*args: str, site: Site = TEST_SITE) -> list[str]:
    """A ``celery`` command on the site's app (the test site's unless told)."""
    return [sys.executable, "-m", "celery", "-A", site.celery, *args]


def celery_worker_argv(
    queue: str,
    node: str,
    *,
    concurrency: int,
    pool: str = "prefork",
    heartbeat: bool = True,
    site: Site = TEST_SITE,
) -> list[str]:
    """The command of a Celery worker consuming ``queue`` as node ``node@<host>``."""
    argv = celery_argv("worker", "-Q", queue, "-n", f"{node}@%h", "--concurrency", str(concurrency), site=site)
    argv += ["--pool", pool, "--loglevel", "WARNING", "--without-gossip", "--without-mingle"]
    if not heartbeat:
        argv.append("--without-heartbeat")
    return argv


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


@dataclass
class LiveStack:
    """What the tests need to drive and inspect the running system."""

    url: str
    port: int
    database_url: str
    db_name: str
    broker_url: str
    queue: str
    env: dict[str, str]
    log_dir: Path
    workers: int = 1
    concurrency: int = 2
    web_workers: int = 1
    site: Site = TEST_SITE
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    # Chaos tests start, kill and restart processes from several threads.
    _lock: threading.RLock = field(default_factory=threading.RLock)

    #: uvicorn's ``--timeout-graceful-shutdown`` (None: wait for every connection).
    graceful_shutdown: ClassVar[int | None] = 2
    #: Celery's worker heartbeat events.
    worker_heartbeat: ClassVar[bool] = True

    # Database access ------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(psycopg_dsn(self.database_url), autocommit=True, row_factory=dict_row)

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def task_row(self, task_id: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM mcptasks_task WHERE id = %s", (task_id,))
        return rows[0] if rows else None

    def events(self, task_id: str) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM mcptasks_taskevent WHERE task_id = %s ORDER BY at, id", (task_id,))

    # Management commands ------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def shell(self, code: str) -> Any:
        """Run Python in ``manage.py shell`` against the live database; the
        code prints one JSON document, which is returned decoded."""
        out = self.manage("shell", "-c", code).stdout.strip().splitlines()
        return json.loads(out[-1])

    def create_tokens(self, usernames: list[str]) -> dict[str, str]:
        """DRF token keys for these users (created as needed), in one command."""
        code = (
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            "from rest_framework.authtoken.models import Token\n"
            "out = {}\n"
            f"for name in {usernames!r}:\n"
            "    user, _ = get_user_model().objects.get_or_create(username=name)\n"
            "    out[name] = Token.objects.get_or_create(user=user)[0].key\n"
            "print(json.dumps(out))\n"
        )
        return self.shell(code)

    def create_user_token(self, username: str) -> str:
        return self.create_tokens([username])[username]

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{tail(self.log_dir / f'{name}.log')}" for name in self.procs)

    def log_text(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    # Processes ----------------------------------------------------------------------------

    def web_argv(self) -> list[str]:
        return uvicorn_argv(
            self.port, self.site.asgi, workers=self.web_workers, graceful_shutdown=self.graceful_shutdown
        )

    def worker_argv(self, index: int) -> list[str]:
        node = f"worker{index}-{self.queue}"
        return celery_worker_argv(
            self.queue, node, concurrency=self.concurrency, heartbeat=self.worker_heartbeat, site=self.site
        )

    def launch(self) -> None:
        """Start the tool workers and the web process; return once the web answers."""
        self.start_workers()
        self.start_web()

    def start_workers(self) -> None:
        for index in range(self.workers):
            self.start(f"worker{index}", self.worker_argv(index))

    def start_web(self) -> subprocess.Popen[bytes]:
        proc = self.start("web", self.web_argv())
        wait_http(self.url, proc, self.log_dir / "web.log")
        return proc

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Run ``argv`` as process ``name``, in a process group of its own, logging to ``<name>.log``."""
        with self._lock:
            proc = processes.start(argv, env=self.env, log=self.log_dir / f"{name}.log", cwd=REPO)
            self.procs[name] = proc
            self.argv[name] = list(argv)
        return proc

    def crash(self, name: str) -> None:
        """SIGKILL a process and all its children (no clean shutdown)."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def restart(self, name: str, sig: int = signal.SIGTERM, *, grace: float = 5.0) -> subprocess.Popen[bytes]:
        """Stop ``name``'s process group with ``sig`` if it still runs (SIGKILL
        after ``grace`` seconds, orphans included) and start the same command
        again; a web process is waited for."""
        with self._lock:
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
            kill_group(proc, grace=grace)
            self.restarts[name] = self.restarts.get(name, 0) + 1
            proc = self.start(name, self.argv[name])
        if name == "web":
            wait_http(self.url, proc, self.log_dir / "web.log")
        return proc

    def worker_processes(self) -> dict[int, str]:
        """Every live tool-worker process (main and pool children): pid -> ``<name>:main|child``."""
        found: dict[int, str] = {}
        with self._lock:
            mains = {name: p for name, p in self.procs.items() if name.startswith("worker") and p.poll() is None}
        for name, proc in mains.items():
            found[proc.pid] = f"{name}:main"
            for pid in child_pids(proc.pid):
                found[pid] = f"{name}:child"
        return found

    def worker_pids(self) -> set[int]:
        """The Celery pool processes (children of the worker main processes)."""
        return {pid for pid, role in self.worker_processes().items() if role.endswith(":child")}

    def stop(self) -> None:
        with self._lock:
            for proc in self.procs.values():  # all at once: shutdowns overlap
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
            for proc in self.procs.values():
                kill_group(proc)


def admin_connect(database_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(psycopg_dsn(with_database(database_url, "postgres")), autocommit=True)


def create_database(database_url: str, name: str) -> None:
    with admin_connect(database_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(database_url: str, name: str) -> None:
    with admin_connect(database_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


Stack = TypeVar("Stack", bound="LiveStack")


def new_stack(
    stack_type: type[Stack],
    log_dir: Path,
    *,
    database_url: str,
    redis_url: str,
    settings: Mapping[str, str],
    name: str,
    **fields: Any,
) -> Stack:
    """A stack with a database name, Celery queue and port of its own, and its
    processes' environment; its database is created and migrated. ``name``
    tells stacks apart in database and queue names."""
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    db_name = f"mcptasks_{name}_{tag}"
    live_db = with_database(database_url, db_name)
    queue = f"mcptasks-{'test' if name == 'live' else name}-{tag}"
    port = free_port()
    env = base_env(
        {
            **settings,
            "DATABASE_URL": live_db,
            "CELERY_BROKER_URL": redis_url,
            "REDIS_URL": redis_url,
            "MCP_CELERY_QUEUE": queue,
        },
        site=fields.get("site", TEST_SITE),
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = stack_type(
        url=f"http://127.0.0.1:{port}/mcp",
        port=port,
        database_url=live_db,
        db_name=db_name,
        broker_url=redis_url,
        queue=queue,
        env=env,
        log_dir=log_dir,
        **fields,
    )
    create_database(database_url, db_name)
    try:
        stack.manage("migrate", "--noinput", timeout=300)
    except BaseException:
        drop_database(database_url, db_name)
        raise
    return stack


def launch_stack(
    stack_type: type[Stack],
    log_dir: Path,
    *,
    database_url: str,
    redis_url: str,
    settings: Mapping[str, str],
    name: str,
    **fields: Any,
) -> Stack:
    """``new_stack``, then its processes (``launch``); once the web answers it is
    returned. On any failure what was started is torn down and the database dropped."""
    stack = new_stack(
        stack_type, log_dir, database_url=database_url, redis_url=redis_url, settings=settings, name=name, **fields
    )
    try:
        stack.launch()
    except BaseException:
        teardown_stack(stack)
        raise
    return stack


def start_stack(
    log_dir: Path,
    *,
    database_url: str | None = None,
    redis_url: str | None = None,
    settings: Mapping[str, str] | None = None,
    concurrency: int = 2,
    site: Site = TEST_SITE,
) -> LiveStack:
    """Create and migrate a database, start web and worker, wait until ready:
    the test site's, or the example site's for its own tests."""
    return launch_stack(
        LiveStack,
        log_dir,
        database_url=database_url or os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL),
        redis_url=redis_url or os.environ.get("MCPTASKS_TEST_REDIS_URL", DEFAULT_REDIS_URL),
        settings={**LIVE_SETTINGS, **dict(settings or {})},
        name="live",
        concurrency=concurrency,
        site=site,
    )


def teardown_stack(stack: LiveStack) -> None:
    """Stop the processes and drop the stack's database."""
    stack.stop()
    base = with_database(stack.database_url, "postgres")
    drop_database(base, stack.db_name)
