"""The deployment shapes beyond the main stack (Postgres + Redis), each a live
stack of the test site on real services: MariaDB through the ORM, RabbitMQ as
the broker, and Postgres behind PgBouncer in transaction mode.

Each shape names what it needs; ``unavailable`` says why a machine cannot run
it (a service that does not answer, a program or driver that is missing).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support import live, processes

SHAPES = ("mariadb", "rabbitmq", "pgbouncer")
#: The concurrency limit of the test site's ``limited_work`` tool in these stacks.
CONCURRENCY = 2

MARIADB_URL = os.environ.get("MCPTASKS_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/mcptasks")
RABBITMQ_URL = os.environ.get("MCPTASKS_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


@dataclass(frozen=True)
class Shape:
    """What a shape's stack is given: its database and broker URLs and the
    settings it differs in."""

    name: str
    database_url: str
    broker_url: str
    settings: dict[str, str]


def answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def unavailable(shape: str) -> str | None:
    """Why this machine cannot run ``shape``, or None."""
    if shape == "mariadb":
        try:
            import MySQLdb  # noqa: F401
        except ImportError:
            return "mysqlclient is not installed (pip install -r requirements/deployments.txt)"
        if not answers(MARIADB_URL, 3306):
            return f"no MariaDB answers at {MARIADB_URL}"
    elif shape == "rabbitmq":
        if not answers(RABBITMQ_URL, 5672):
            return f"no RabbitMQ answers at {RABBITMQ_URL}"
    elif shape == "pgbouncer" and pgbouncer_binary() is None:
        return "pgbouncer is not installed (Debian package pgbouncer)"
    return None


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(path, os.X_OK)), None
    )


# MariaDB ------------------------------------------------------------------------------------------


def mariadb_admin(url: str) -> Any:
    import MySQLdb

    parts = urlsplit(url)
    return MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
    )


def create_mariadb_database(url: str, name: str) -> None:
    conn = mariadb_admin(url)
    try:
        cursor = conn.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    finally:
        conn.close()


def drop_mariadb_database(url: str, name: str) -> None:
    conn = mariadb_admin(url)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


# PgBouncer ----------------------------------------------------------------------------------------


@contextmanager
def pgbouncer(postgres_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of ``postgres_url``'s server,
    on a port of its own; yields the URL of the same server through it."""
    binary = pgbouncer_binary()
    assert binary is not None
    parts = urlsplit(postgres_url)
    port = processes.free_port()
    # PgBouncer will not run as root: it drops to the server's owner, who must
    # read its configuration and write its log.
    work = Path(tempfile.mkdtemp(prefix="mcptasks-pgbouncer-"))
    user = parts.username or "postgres"
    (work / "users.txt").write_text(f'"{user}" ""\n')
    config = work / "pgbouncer.ini"
    config.write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {work / 'users.txt'}",
                "pool_mode = transaction",
                "max_client_conn = 500",
                "default_pool_size = 40",
                "ignore_startup_parameters = extra_float_digits,options",
                f"pidfile = {work / 'pgbouncer.pid'}",
                "",
            ]
        )
    )
    argv = [binary, str(config)]
    if os.geteuid() == 0:
        shutil.chown(work, user)
        work.chmod(0o755)
        for path in work.iterdir():
            shutil.chown(path, user)
        argv = [binary, "-u", user, str(config)]
    proc = processes.start(argv, env=dict(os.environ), log=work / "pgbouncer.log", cwd=work)
    try:
        wait_listening(port, proc, work / "pgbouncer.log")
        netloc = f"{user}@127.0.0.1:{port}"
        yield parts._replace(netloc=netloc).geturl()
    finally:
        processes.kill_group(proc)
        shutil.rmtree(work, ignore_errors=True)


def wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, *, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited ({proc.returncode}):\n{processes.tail(log)}")
        with suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"pgbouncer did not listen on {port}:\n{processes.tail(log)}")


# The stacks --------------------------------------------------------------------------------------


@contextmanager
def deployment_stack(shape: str, log_dir: Path) -> Iterator[live.LiveStack]:
    """A live stack of the test site in ``shape``: database created and
    migrated, web and worker started; everything torn down after."""
    postgres_url = os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL)
    redis_url = os.environ.get("MCPTASKS_TEST_REDIS_URL", live.DEFAULT_REDIS_URL)
    if not postgres_url.startswith(("postgres://", "postgresql://")):
        postgres_url = live.DEFAULT_DATABASE_URL
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    db_name = f"mcptasks_deploy_{shape}_{tag}"
    queue = f"mcptasks-deploy-{shape}-{tag}"
    settings = dict(live.LIVE_SETTINGS)
    with _database(shape, postgres_url, db_name) as database_url:
        broker_url = RABBITMQ_URL if shape == "rabbitmq" else redis_url
        if shape == "pgbouncer":
            # A pooler in transaction mode keeps no prepared statement and no
            # LISTEN across transactions (docs/operators.md, "Behind a pooler").
            settings.update({"MCP_PREPARE_STATEMENTS": "false", "MCP_POLL_SNAPSHOT": "false"})
            settings["DISABLE_SERVER_SIDE_CURSORS"] = "true"
        port = processes.free_port()
        env = live.base_env(
            {
                **settings,
                "DATABASE_URL": database_url,
                "CELERY_BROKER_URL": broker_url,
                "REDIS_URL": redis_url,
                "MCP_CELERY_QUEUE": queue,
                # The database decides a tool's concurrency across worker processes.
                "MCP_TOOL_CONTROLS": json.dumps({"limited_work": {"concurrency": CONCURRENCY}}),
            }
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        stack = live.LiveStack(
            url=f"http://127.0.0.1:{port}/mcp",
            port=port,
            database_url=database_url,
            db_name=db_name,
            broker_url=broker_url,
            queue=queue,
            env=env,
            log_dir=log_dir,
            workers=2,
        )
        try:
            stack.manage("migrate", "--noinput", timeout=300)
            stack.launch()
            yield stack
        finally:
            stack.stop()
            if shape == "rabbitmq":
                _delete_queue(broker_url, queue)


@contextmanager
def _database(shape: str, postgres_url: str, name: str) -> Iterator[str]:
    if shape == "mariadb":
        create_mariadb_database(MARIADB_URL, name)
        try:
            yield live.with_database(MARIADB_URL, name)
        finally:
            drop_mariadb_database(MARIADB_URL, name)
        return
    live.create_database(postgres_url, name)
    try:
        if shape == "pgbouncer":
            with pgbouncer(postgres_url) as pooled:
                yield live.with_database(pooled, name)
        else:
            yield live.with_database(postgres_url, name)
    finally:
        live.drop_database(postgres_url, name)


def _delete_queue(broker_url: str, queue: str) -> None:
    """A RabbitMQ queue outlives its consumers: the run's own goes with it."""
    from kombu import Connection

    with suppress(Exception), Connection(broker_url, connect_timeout=5) as conn:
        conn.default_channel.queue_delete(queue)
