"""``manage.py mcptasks run`` serving MCP and running tasks on its own
database, then stopping with every process it started. The other
sub-commands are tested in-process in tests/test_commands.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.support import live, postgres_only
from tests.support.rpc import HttpRpc
from tests.support.waiting import wait_until


@pytest.mark.live
@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("broker", ["embedded", pytest.param("redis-threads", marks=postgres_only.LIVE_STACK)])
def test_run_serves_mcp_and_runs_tasks_then_stops_cleanly(tmp_path: Path, broker: str):
    """``mcptasks run`` against its own database (Postgres, or a SQLite file
    in the SQLite pass): on the embedded default (in-process broker, worker
    and beat threads), and on Redis with a threads-pool worker process
    (``--pool threads``)."""
    on_postgres = connection.vendor == "postgresql"
    base = live.os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL)
    name = f"mcptasks_run_{live.os.getpid()}"
    url = live.with_database(base, name) if on_postgres else f"sqlite:///{tmp_path / 'run.sqlite3'}"
    if broker == "embedded":
        services, extra = {"CELERY_BROKER_URL": "memory://"}, []
    else:
        redis_url = live.os.environ.get("MCPTASKS_TEST_REDIS_URL", live.DEFAULT_REDIS_URL)
        services = {"CELERY_BROKER_URL": redis_url, "MCP_CELERY_QUEUE": f"mcptasks-run-{live.os.getpid()}"}
        extra = ["--pool", "threads"]
    env = live.base_env({**live.LIVE_SETTINGS, "DATABASE_URL": url, **services})
    if on_postgres:
        live.create_database(base, name)
    proc = None
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=live.REPO,
            env=env,
            check=True,
            capture_output=True,
        )
        port = live.free_port()
        log = tmp_path / "run.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "mcptasks", "run", "--port", str(port), "--concurrency", "2", *extra],
                cwd=live.REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        mcp_url = f"http://127.0.0.1:{port}/mcp"
        live.wait_http(mcp_url, proc, log)
        client = HttpRpc(mcp_url)
        try:
            task_id = client.create_task("slow_compute", {"seconds": 0.2, "label": "run"})
            final = client.wait_for(task_id, timeout=30)
        finally:
            client.close()
        assert final["status"] == "completed", (final, live.tail(log))
        if broker != "embedded":
            assert "celery worker (2 threads)" in log.read_text(), live.tail(log)
        # SIGTERM to the run process alone, as a supervisor stops a program:
        # its worker and beat must stop with it, not outlive it.
        proc.send_signal(live.signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -live.signal.SIGTERM), live.tail(log)
        wait_until(lambda: not _session_alive(proc.pid), timeout=30, what="the run's worker and beat to stop with it")
    finally:
        if proc is not None:
            live.kill_group(proc)
        if on_postgres:
            live.drop_database(base, name)


def _session_alive(session_id: int) -> bool:
    """Whether any process of the session ``session_id`` leads is still running."""
    try:
        live.os.killpg(session_id, 0)
    except ProcessLookupError:
        return False
    return True
