"""A real running system for end-to-end tests: a dedicated Postgres database,
a uvicorn web process and a Celery worker on Redis.

Everything is unique to the run (database name, Celery queue, worker node
name, port), so two runs on one machine do not share work. Each process gets
its own process group and the whole group is killed at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/mcptasks"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

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
}

#: Variables of the calling environment that must not leak into the stack.
_SCRUB = ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "MCP_CELERY_QUEUE", "PORT", "HOST")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def psycopg_dsn(url: str) -> str:
    """A libpq URI from a django-environ style URL (``postgres://`` or ``postgresql://``)."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, parts.fragment))


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("MCP_")}
    env.update({"DJANGO_SETTINGS_MODULE": "project.settings", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def kill_group(proc: subprocess.Popen[bytes], *, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # children may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, *, timeout: float = 60.0) -> None:
    """Until a server/discover on ``url`` answers 200 (or 401 when anonymous access is off)."""
    import httpx

    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering:\n{tail(log)}")
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=2)
            if response.status_code in (200, 401):  # 401: up, and it wants a signed-in caller
                return
            last = response.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"server at {url} not ready after {timeout}s (last: {last}):\n{tail(log)}")


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
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)

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

    def create_user_token(self, username: str) -> str:
        code = (
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            "from rest_framework.authtoken.models import Token\n"
            f"user, _ = get_user_model().objects.get_or_create(username={username!r})\n"
            "token, _ = Token.objects.get_or_create(user=user)\n"
            "print(json.dumps(token.key))\n"
        )
        return self.shell(code)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{tail(self.log_dir / f'{name}.log')}" for name in self.procs)

    def worker_pids(self) -> set[int]:
        """The Celery pool processes (children of the worker main process)."""
        worker = self.procs["worker"]
        out = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout
        return {int(pid) for pid in out.split()}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs[name] = proc
        self.argv[name] = list(argv)
        return proc

    def crash(self, name: str) -> None:
        """SIGKILL a process and all its children (no clean shutdown)."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` again with the same command (after ``crash``)."""
        if self.procs[name].poll() is None:
            kill_group(self.procs[name])
        proc = self.start(name, self.argv[name])
        if name == "web":
            wait_http(self.url, proc, self.log_dir / "web.log")
        return proc

    def stop(self) -> None:
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
        }
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


def start_stack(
    log_dir: Path,
    *,
    database_url: str | None = None,
    redis_url: str | None = None,
    settings: Mapping[str, str] | None = None,
    concurrency: int = 2,
) -> LiveStack:
    """Create and migrate a database, start web and worker, wait until ready.

    On any failure the parts already started are torn down again.
    """
    base_url = database_url or os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    broker = redis_url or os.environ.get("MCPTASKS_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    stack = new_stack(
        LiveStack,
        log_dir,
        database_url=base_url,
        redis_url=broker,
        settings={**LIVE_SETTINGS, **dict(settings or {})},
        name="live",
    )
    port, queue = stack.port, stack.queue
    try:
        web = stack.start(
            "web",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "project.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--lifespan",
                "off",
                "--timeout-graceful-shutdown",
                "2",
            ],
        )
        stack.start(
            "worker",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "-Q",
                queue,
                "-n",
                f"{queue}@%h",
                "--concurrency",
                str(concurrency),
                "--pool",
                "prefork",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
            ],
        )
        wait_http(stack.url, web, log_dir / "web.log")
    except BaseException:
        stack.stop()
        drop_database(base_url, stack.db_name)
        raise
    return stack


def teardown_stack(stack: LiveStack) -> None:
    stack.stop()
    base = with_database(stack.database_url, "postgres")
    drop_database(base, stack.db_name)
