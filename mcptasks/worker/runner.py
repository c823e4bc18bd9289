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
from typing import Any, cast

from .discovery import Found
from .static_files import with_static_files

logger = logging.getLogger("mcptasks.runner")


def broker_is_in_process(app: Any) -> bool:
    return str(app.conf.broker_url or "").startswith("memory://")


def beat_schedule_file(app: Any) -> str:
    """Celery's own ``beat_schedule_filename`` (``CELERY_BEAT_SCHEDULE_FILENAME``
    with the usual namespace; Celery's default is ``celerybeat-schedule`` in the
    current directory). Its folder is made if missing."""
    path = str(app.conf.beat_schedule_filename)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    return path


def worker_queues(app: Any, chosen: list[str] | None = None) -> list[str]:
    """The queues a worker started here consumes: ``chosen`` (``--queues``),
    else every queue the site sends runs to (``CELERY_QUEUE`` and each tool's
    own) and Celery's default one (the sweeper and the prune, as beat sends
    them)."""
    from ..tools import effective

    if chosen:
        return list(dict.fromkeys(q.strip() for q in chosen if q.strip()))
    return [q for q in dict.fromkeys((*effective.configured_queues(), app.conf.task_default_queue)) if q]


def start_embedded_worker(app: Any, concurrency: int, queues: list[str] | None = None) -> list[Any]:
    """A thread-pool worker and a beat thread inside this process, on the
    site's own app (the in-process broker exists only in this process)."""
    from celery.beat import EmbeddedService

    worker = app.WorkController(
        pool_cls="threads",
        queues=worker_queues(app, queues),
        concurrency=concurrency,
        hostname=f"embedded@{os.uname().nodename}",
        loglevel="WARNING",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    # thread=True makes it a thread (Celery's stubs name both kinds).
    beat = cast(threading.Thread, EmbeddedService(app, thread=True, schedule_filename=beat_schedule_file(app)))
    threading.Thread(target=worker.start, name="mcptasks-worker", daemon=True).start()
    beat.start()
    return [worker, beat]


def start_worker_processes(
    app: Any, app_name: str, concurrency: int, pool: str = "prefork", queues: list[str] | None = None
) -> list[subprocess.Popen[bytes]]:
    base = [sys.executable, "-m", "celery", "-A", app_name]
    worker = [*base, "worker", "--loglevel", "WARNING", "--pool", pool, "--concurrency", str(concurrency)]
    env = child_environment(app_name)
    return [
        subprocess.Popen([*worker, "-Q", ",".join(worker_queues(app, queues))], env=env),
        subprocess.Popen([*base, "beat", "--loglevel", "WARNING", "--schedule", beat_schedule_file(app)], env=env),
    ]


def child_environment(app_name: str) -> dict[str, str]:
    """This process's environment, with the folder that holds the app's
    top-level package first on ``PYTHONPATH``: ``celery -A`` imports from the
    current folder, which need not be the site's (``python path/to/manage.py``)."""
    env = dict(os.environ)
    top = sys.modules.get(app_name.partition(":")[0].split(".")[0])
    origin = getattr(top, "__file__", None)
    if origin:
        # A package's __file__ is its __init__.py, one folder deeper than a module's.
        folder = os.path.dirname(os.path.dirname(origin)) if hasattr(top, "__path__") else os.path.dirname(origin)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
    return env


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


def server_config(application: Any, *, host: str, port: int, forwarded_allow_ips: str | None) -> Any:
    """uvicorn's configuration. ``X-Forwarded-For`` and ``X-Forwarded-Proto``
    are believed only from the proxies named in ``forwarded_allow_ips``
    (comma-separated addresses or networks, ``*`` for any): uvicorn's own
    default trusts them from loopback, so a local proxy that passes a
    client's headers on would let the client choose its address (and escape
    per-address limits) and the scheme of the URLs the site advertises."""
    import uvicorn

    trusted = (forwarded_allow_ips or "").strip()
    return uvicorn.Config(
        application,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
    )


def run(
    *,
    host: str,
    port: int,
    concurrency: int,
    asgi: Found,
    celery: Found,
    pool: str = "prefork",
    forwarded_allow_ips: str | None = None,
    queues: list[str] | None = None,
) -> None:
    app = celery.obj
    # Runs published from this process go through the site's app, whatever
    # Celery took for current before.
    app.set_current()
    app.set_default()
    server_class = graceful_server_class()
    children: list[subprocess.Popen[bytes]] = []
    embedded: list[Any] = []
    if broker_is_in_process(app):
        embedded = start_embedded_worker(app, concurrency, queues)
        mode = f"embedded worker ({concurrency} threads) and beat"
    else:
        children = start_worker_processes(app, celery.name, concurrency, pool, queues)
        slots = "processes" if pool == "prefork" else "threads"
        mode = f"celery worker ({concurrency} {slots}) and beat"
    print(f"mcptasks: the worker consumes the queues {', '.join(worker_queues(app, queues))}", flush=True)
    print(f"mcptasks: serving http://{host}:{port}/mcp with {mode}", flush=True)
    print(f"mcptasks: ASGI application {asgi.name} (from {asgi.source})", flush=True)
    print(f"mcptasks: Celery app {celery.name} (from {celery.source})", flush=True)
    application, static_files = with_static_files(asgi.obj)
    print(f"mcptasks: {static_files}", flush=True)

    config = server_config(application, host=host, port=port, forwarded_allow_ips=forwarded_allow_ips)
    if config.proxy_headers:
        print(f"mcptasks: trusting X-Forwarded-For/Proto from {config.forwarded_allow_ips}", flush=True)
    server = server_class(config)

    def watch_children() -> None:
        for child in children:
            child.wait()
            if not server.should_exit:
                logger.error("a child process exited (%s); stopping", child.args)
                server.should_exit = True

    if children:
        threading.Thread(target=watch_children, daemon=True).start()
    # uvicorn sends a SIGTERM it caught to the process again once it has shut
    # down; with the default action this process would die on the spot and
    # leave its worker and beat running. Caught here, the children are
    # stopped first, then the process ends by the signal as before.
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        try:
            server.run()
        finally:
            if on_main_thread:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # already stopping
            _stop_children(children, embedded)
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


class _Terminated(Exception):
    """SIGTERM arrived outside uvicorn's own handling (see ``run``)."""


def _raise_terminated(sig: int, frame: Any) -> None:
    raise _Terminated(sig)


def _stop_children(children: list[subprocess.Popen[bytes]], embedded: list[Any]) -> None:
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
