"""The embedded default loses no task when its process is killed.

``manage.py mcptasks run`` on SQLite with the in-process broker: the queued
runs live only in the process's memory and die with it (SIGKILL), as do the
runs in progress. After a restart the sweeper re-dispatches both from the
rows (docs/embedded-default.md, "Durability of queued messages"): the
unclaimed tasks after the dispatch grace, the interrupted runs once their
lease lapses. Short settings (3 s lease and grace, a sweep every second) keep
it quick.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import live
from tests.support.rpc import HttpRpc

pytestmark = pytest.mark.live


class EmbeddedSite:
    """One SQLite file, served by ``mcptasks run`` processes started one after another."""

    def __init__(self, work: Path) -> None:
        self.db = work / "db.sqlite3"
        self.log = work / "server.log"
        self.env = live.base_env(
            {
                **live.LIVE_SETTINGS,
                "DATABASE_URL": f"sqlite:///{self.db}",
                "MCP_DISPATCH_GRACE_SECONDS": "3",
                "MCP_SWEEP_SECONDS": "1",
            }
        )
        self.proc: subprocess.Popen[bytes] | None = None
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=live.REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert migrate.returncode == 0, migrate.stderr

    def start(self) -> str:
        port = live.free_port()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "mcptasks", "run", "--port", str(port), "--concurrency", "2"],
                cwd=live.REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}/mcp"
        live.wait_http(url, self.proc, self.log)
        return url

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with sqlite3.connect(self.db, timeout=30) as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[EmbeddedSite]:
    site = EmbeddedSite(tmp_path)
    try:
        yield site
    finally:
        if site.proc is not None:
            live.kill_group(site.proc)


def test_a_killed_process_loses_no_task(site: EmbeddedSite) -> None:
    client = HttpRpc(site.start())
    try:
        # Two worker threads, eight 2 s runs: two start, six wait in the broker.
        ids = [client.create_task("slow_compute", {"seconds": 2, "label": f"k{n}"}) for n in range(8)]
    finally:
        client.close()
    deadline = time.monotonic() + 30
    while not (running := {row[0] for row in site.query("SELECT id FROM mcptasks_task WHERE lease_owner != ''")}):
        assert time.monotonic() < deadline, f"no run started:\n{live.tail(site.log)}"
        time.sleep(0.05)
    site.kill()
    unfinished = {row[0] for row in site.query("SELECT id FROM mcptasks_task WHERE status = 'working'")}
    interrupted, queued = running & unfinished, unfinished - running
    assert interrupted, "the runs in progress all finished before the kill"
    assert queued, "no run was left waiting in the broker"

    client = HttpRpc(site.start())
    try:
        finals = {task_id: client.wait_for(task_id, timeout=90) for task_id in ids}
    finally:
        client.close()
    assert {task_id: final["status"] for task_id, final in finals.items()} == dict.fromkeys(ids, "completed"), (
        live.tail(site.log)
    )
    events = site.query("SELECT task_id, kind FROM mcptasks_taskevent WHERE kind IN ('run_started', 'redispatched')")
    starts = {task_id: sum(1 for t, kind in events if t == task_id and kind == "run_started") for task_id in ids}
    redispatched = {task_id for task_id, kind in events if kind == "redispatched"}
    # The sweeper brought back both kinds; the runs cut short ran again.
    assert unfinished <= redispatched, (unfinished - redispatched, events)
    assert all(starts[task_id] >= 2 for task_id in interrupted), starts
    assert all(starts[task_id] >= 1 for task_id in queued), starts
