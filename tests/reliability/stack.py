"""A complete deployment for fault tests: web, tool workers, a sweeper and
beat, on a private Postgres and a private Redis (see ``services``).

It reuses ``tests.support.live`` (the database helpers, ``LiveStack``'s
queries and management commands) and adds what chaos needs: several worker
instances, Celery beat with a fast sweep, and methods to kill and restart each
process. Tool workers consume the stack's own queue; the periodic sweep runs
on a separate one-process worker (the ``celery`` default queue), as a
deployment would keep maintenance apart from tool runs.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.live import (
    LIVE_SETTINGS,
    LiveStack,
    kill_group,
    new_stack,
    tail,
    wait_http,
)
from tests.support.waiting import wait_until as wait_until

#: Recovery in seconds, not minutes: a lapsed lease or a lost message is seen
#: within about two seconds by a sweep that runs every second.
CHAOS_SETTINGS = {
    **LIVE_SETTINGS,
    "DJANGO_SETTINGS_MODULE": "tests.reliability.site_settings",
    "MCP_LEASE_SECONDS": "3",
    "MCP_HEARTBEAT_SECONDS": "0.5",
    "MCP_DISPATCH_GRACE_SECONDS": "3",
    "MCP_SWEEP_SECONDS": "1",
    "MCP_MAX_ATTEMPTS": "3",
    "MCP_POLL_INTERVAL_MS": "100",
    # The load generators poll faster than the interval on purpose; the
    # throttle itself is tested on its own (tests/test_limits.py).
    "MCP_POLL_BURST": "0",
    "MCP_MAX_ACTIVE_TASKS": "100000",
}


@dataclass
class ChaosStack(LiveStack):
    """A ``LiveStack`` whose processes can be killed and brought back."""

    workers: int = 1
    concurrency: int = 2
    web_workers: int = 1
    restarts: dict[str, int] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # Processes -----------------------------------------------------------------------

    def web_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--log-level", "warning", "--lifespan", "off"]
        if self.web_workers > 1:
            argv += ["--workers", str(self.web_workers)]
        return argv

    def worker_argv(self, index: int) -> list[str]:
        return [
            *self._celery(),
            "worker",
            "-Q",
            self.queue,
            "-n",
            f"tools{index}-{self.queue}@%h",
            "--concurrency",
            str(self.concurrency),
            "--pool",
            "prefork",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]

    def _celery(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "project"]

    def start_web(self) -> None:
        with self._lock:
            proc = self.start("web", self.web_argv())
        wait_http(self.url, proc, self.log_dir / "web.log")

    def start_workers(self) -> None:
        for index in range(self.workers):
            self.start(f"worker{index}", self.worker_argv(index))

    def start_maintenance(self) -> None:
        """Beat (a sweep every ``MCP_SWEEP_SECONDS``) and the worker that runs the sweeps."""
        self.start(
            "sweeper",
            [
                *self._celery(),
                "worker",
                "-Q",
                "celery",
                "-n",
                f"sweeper-{self.queue}@%h",
                "--concurrency",
                "1",
                "--pool",
                "solo",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
        )
        self.start(
            "beat",
            [*self._celery(), "beat", "--loglevel", "WARNING", "--schedule", str(self.log_dir / "beat-schedule")],
        )

    def restart_web(self, sig: int = signal.SIGKILL) -> None:
        """Stop the web process with ``sig`` (its whole group) and start a new one on the same port."""
        with self._lock:
            proc = self.procs["web"]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            kill_group(proc, grace=10)
            self.restarts["web"] = self.restarts.get("web", 0) + 1
        self.start_web()

    def worker_processes(self) -> dict[int, str]:
        """Every live tool-worker process (main and pool children): pid -> role."""
        found: dict[int, str] = {}
        with self._lock:
            mains = {name: p for name, p in self.procs.items() if name.startswith("worker") and p.poll() is None}
        for name, proc in mains.items():
            found[proc.pid] = f"{name}:main"
            out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
            for pid in out.split():
                found[int(pid)] = f"{name}:child"
        return found

    def kill_random_worker_process(self, rng: random.Random, main_share: float = 0.2) -> str | None:
        """SIGKILL one tool-worker process: usually a pool child (a tool run
        dies), sometimes a main process (the whole worker dies)."""
        procs = self.worker_processes()
        if not procs:
            return None
        mains = [pid for pid, role in procs.items() if role.endswith(":main")]
        children = [pid for pid, role in procs.items() if role.endswith(":child")]
        pool = mains if (mains and (rng.random() < main_share or not children)) else children
        pid = rng.choice(pool)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return procs[pid]

    def supervise(self) -> None:
        """Restart every tool worker whose main process is gone (what
        systemd or a container runtime would do); kill its orphans first."""
        with self._lock:
            for index in range(self.workers):
                name = f"worker{index}"
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is None:
                    continue
                if proc is not None:
                    kill_group(proc, grace=0.1)
                self.restarts[name] = self.restarts.get(name, 0) + 1
                self.start(name, self.worker_argv(index))

    def stop(self) -> None:
        with self._lock:
            for proc in self.procs.values():
                kill_group(proc)

    def log_text(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{tail(self.log_dir / f'{name}.log')}" for name in self.procs)

    # Identities ---------------------------------------------------------------------------

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


def start_chaos_stack(
    log_dir: Path,
    *,
    database_url: str,
    redis_url: str,
    settings: Mapping[str, str] | None = None,
    workers: int = 1,
    concurrency: int = 2,
    web_workers: int = 1,
    sweeper: bool = True,
) -> ChaosStack:
    """Create and migrate a database on ``database_url``'s server and start
    web, tool workers and (with ``sweeper``) beat plus the sweeper worker."""
    stack = new_stack(
        ChaosStack,
        log_dir,
        database_url=database_url,
        redis_url=redis_url,
        settings={**CHAOS_SETTINGS, **dict(settings or {})},
        name="chaos",
        workers=workers,
        concurrency=concurrency,
        web_workers=web_workers,
    )
    try:
        stack.start_workers()
        if sweeper:
            stack.start_maintenance()
        stack.start_web()
    except BaseException:
        stack.stop()
        raise
    return stack
