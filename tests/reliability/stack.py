"""A complete deployment for fault tests: web, tool workers, a sweeper and
beat, on a private Postgres and a private Redis (see ``services``).

It is ``tests.support.live``'s ``LiveStack``, launched the same way, with
what chaos adds: several worker instances, Celery beat with a fast sweep, and
killing and restarting processes while load runs. Tool workers consume the stack's own queue; the periodic sweep runs
on a separate one-process worker (the ``celery`` default queue), as a
deployment would keep maintenance apart from tool runs.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.reliability.services import Services
from tests.support.live import LIVE_SETTINGS, LiveStack, celery_argv, celery_worker_argv, launch_stack, teardown_stack

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
    """A ``LiveStack`` with beat and a sweeper, whose processes can be killed and brought back."""

    sweeper: bool = True

    # A web process stopped under load waits for its streams until killed.
    graceful_shutdown: ClassVar[int | None] = None
    worker_heartbeat: ClassVar[bool] = False

    def launch(self) -> None:
        self.start_workers()
        if self.sweeper:
            self.start_maintenance()
        self.start_web()

    def start_maintenance(self) -> None:
        """Beat (a sweep every ``MCP_SWEEP_SECONDS``) and the worker that runs the sweeps."""
        node = f"sweeper-{self.queue}"
        self.start("sweeper", celery_worker_argv("celery", node, concurrency=1, pool="solo", heartbeat=False))
        self.start(
            "beat", celery_argv("beat", "--loglevel", "WARNING", "--schedule", str(self.log_dir / "beat-schedule"))
        )

    def restart_web(self, sig: int = signal.SIGKILL) -> None:
        """Stop the web process with ``sig`` (its whole group) and start a new one on the same port."""
        self.restart("web", sig, grace=10)

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
                proc = self.procs[f"worker{index}"]
                if proc.poll() is not None:
                    self.restart(f"worker{index}", grace=0.1)


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
    return launch_stack(
        ChaosStack,
        log_dir,
        database_url=database_url,
        redis_url=redis_url,
        settings={**CHAOS_SETTINGS, **dict(settings or {})},
        name="chaos",
        workers=workers,
        concurrency=concurrency,
        web_workers=web_workers,
        sweeper=sweeper,
    )


@contextlib.contextmanager
def running_chaos_stack(services: Services, log_dir: Path, **options: Any) -> Iterator[ChaosStack]:
    """A chaos stack on ``services`` (``start_chaos_stack``'s options), stopped
    and its database dropped at the end of the block."""
    stack = start_chaos_stack(log_dir, database_url=services.postgres.url, redis_url=services.redis.url, **options)
    try:
        yield stack
    finally:
        teardown_stack(stack)
