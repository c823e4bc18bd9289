"""``manage.py mcptasks run``: web, worker and beat from one command.

On the embedded default (``memory://`` broker) the Celery worker and beat run
as threads of the web process: the in-process broker exists only there. With
a real broker they run as child processes (``celery worker`` and ``celery
beat``), supervised here: if one exits, everything stops.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from django.conf import settings as django_settings

from ..conf import settings as mcp_settings

logger = logging.getLogger("mcptasks.runner")


def celery_app() -> Any:
    from celery import current_app

    return current_app._get_current_object()


def broker_is_in_process() -> bool:
    return str(getattr(django_settings, "CELERY_BROKER_URL", "memory://")).startswith("memory://")


def start_embedded_worker(concurrency: int) -> list[Any]:
    """A thread-pool worker and a beat thread inside this process."""
    from celery.beat import EmbeddedService

    app = celery_app()
    worker = app.WorkController(
        pool_cls="threads",
        concurrency=concurrency,
        hostname=f"embedded@{os.uname().nodename}",
        loglevel="WARNING",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    beat_dir = django_settings.BASE_DIR / "var" if hasattr(django_settings, "BASE_DIR") else None
    beat_file = str(beat_dir / "celerybeat-schedule") if beat_dir else "celerybeat-schedule"
    if beat_dir:
        beat_dir.mkdir(parents=True, exist_ok=True)
    beat = EmbeddedService(app, thread=True, schedule_filename=beat_file)
    threading.Thread(target=worker.start, name="mcptasks-worker", daemon=True).start()
    beat.start()
    return [worker, beat]


def start_worker_processes(concurrency: int, pool: str = "prefork") -> list[subprocess.Popen[bytes]]:
    app_name = os.environ.get("MCPTASKS_CELERY_APP", "project")
    base = [sys.executable, "-m", "celery", "-A", app_name]
    beat_file = os.path.join(str(getattr(django_settings, "BASE_DIR", ".")), "var", "celerybeat-schedule")
    os.makedirs(os.path.dirname(beat_file), exist_ok=True)
    # The runs' queue (MCPTASKS CELERY_QUEUE) and the default one (the sweeper
    # and the purge, as beat sends them).
    queues = dict.fromkeys(q for q in (mcp_settings.CELERY_QUEUE, celery_app().conf.task_default_queue) if q)
    worker = [*base, "worker", "--loglevel", "WARNING", "--pool", pool, "--concurrency", str(concurrency)]
    return [
        subprocess.Popen([*worker, "-Q", ",".join(queues)]),
        subprocess.Popen([*base, "beat", "--loglevel", "WARNING", "--schedule", beat_file]),
    ]


def graceful_server_class() -> type:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """Ends open subscription streams with their final response before
        uvicorn stops waiting for connections to drain."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            from ..notify.fabric import begin_shutdown

            begin_shutdown()
            super().handle_exit(sig, frame)

    return GracefulServer


def run(*, host: str, port: int, concurrency: int, asgi_app: str, pool: str = "prefork") -> None:
    import uvicorn

    server_class = graceful_server_class()
    children: list[subprocess.Popen[bytes]] = []
    embedded: list[Any] = []
    if broker_is_in_process():
        embedded = start_embedded_worker(concurrency)
        mode = f"embedded worker ({concurrency} threads) and beat"
    else:
        children = start_worker_processes(concurrency, pool)
        slots = "processes" if pool == "prefork" else "threads"
        mode = f"celery worker ({concurrency} {slots}) and beat"
    print(f"mcptasks: serving http://{host}:{port}/mcp with {mode}", flush=True)

    server = server_class(uvicorn.Config(asgi_app, host=host, port=port, log_level="warning", lifespan="off"))

    def watch_children() -> None:
        for child in children:
            child.wait()
            if not server.should_exit:
                logger.error("a child process exited (%s); stopping", child.args)
                server.should_exit = True

    if children:
        threading.Thread(target=watch_children, daemon=True).start()
    try:
        server.run()
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        for service in embedded:
            try:
                service.stop()
            except Exception:  # shutting down anyway
                logger.debug("stopping %s failed", service, exc_info=True)
