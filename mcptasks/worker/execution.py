"""Running a tool: inline within a request, or as one run of a durable task.

A task run claims the task's lease, replays the answers recorded so far, calls
the tool, and records the outcome through ``lifecycle``. While the tool runs a
monitor thread renews the lease and watches for a cancel, so the tool's
context learns of a cancel within ``CANCEL_POLL_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from django.db import close_old_connections, connection

from ..conf import settings
from ..errors import INTERNAL_ERROR, HandOff, InputNeeded, InvalidParams, ProtocolError, TaskCancelled
from ..models import Task, TaskStatus
from ..protocol import eras
from ..tasks import lifecycle
from ..telemetry import runs as run_telemetry
from ..tools.calls import tool_context
from ..tools.invoke import invoke
from ..tools.registry import registry
from ..tools.results import error_result

logger = logging.getLogger("mcptasks.execution")


# Task runs -----------------------------------------------------------------------


def worker_name() -> str:
    """Unique per run: a lease names the run that holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseMonitor(threading.Thread):
    """Renews the lease and sets ``cancel_event`` when the task stops being
    ``working`` under this run (cancelled, or the lease was lost)."""

    def __init__(self, task_id: str, worker: str, cancel_event: threading.Event) -> None:
        super().__init__(name=f"mcptasks-lease-{task_id[:8]}", daemon=True)
        self.task_id = task_id
        self.worker = worker
        self.cancel_event = cancel_event
        self._stop = threading.Event()

    def run(self) -> None:
        poll = settings.CANCEL_POLL_SECONDS
        beat_every = settings.HEARTBEAT_SECONDS
        next_beat = time.monotonic() + beat_every
        try:
            while not self._stop.wait(poll):
                try:
                    if time.monotonic() >= next_beat:
                        next_beat = time.monotonic() + beat_every
                        alive = lifecycle.heartbeat(self.task_id, worker=self.worker)
                    else:
                        alive = Task.objects.filter(
                            pk=self.task_id, status=TaskStatus.WORKING, lease_owner=self.worker
                        ).exists()
                except Exception:  # the database blipped: try again next tick
                    logger.warning("lease check failed for %s", self.task_id, exc_info=True)
                    close_old_connections()
                    continue
                if not alive:
                    self.cancel_event.set()
                    return
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()


def run_task(task_id: str) -> str:
    """One run of a task. Returns what happened (for logs and tests)."""
    worker = worker_name()
    run = lifecycle.start_run(task_id, worker=worker)
    if run is None:
        return "skipped"
    run_telemetry.started(run.task, run.answers)
    task = run.task
    actor = lifecycle.worker_actor(worker)
    tool = registry.get(task.tool_name)
    if tool is None:
        lifecycle.fail(task_id, InvalidParams(f"Unknown tool: {task.tool_name}").to_dict(), actor=actor)
        return "failed"
    cancel_event = threading.Event()
    monitor = LeaseMonitor(task_id, worker, cancel_event)
    ctx = tool_context(
        owner=task.owner,
        capabilities=task.client_capabilities,
        answers=run.answers,
        task_id=task_id,
        cancel_event=cancel_event,
        on_status=lambda message: lifecycle.set_status_message(task_id, message, worker=worker),
    )
    monitor.start()
    try:
        kwargs = tool.validate_arguments(task.arguments)
        result = invoke(tool, ctx, kwargs)
    except InputNeeded as need:
        run_telemetry.input_asked(need.requests)
        lifecycle.request_input(task_id, need.requests, worker=worker)
        return "input_required"
    except TaskCancelled:
        return "cancelled"
    except HandOff:  # cannot happen inside a task; treat as a bug in the tool
        result = error_result(f"Tool '{tool.name}' handed off twice.")
    except ProtocolError as exc:
        lifecycle.fail(task_id, exc.to_dict(), actor=actor, worker=worker)
        return "failed"
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            lifecycle.release(task_id, worker=worker)
            raise
        logger.exception("run of task %s crashed", task_id)
        lifecycle.fail(task_id, {"code": INTERNAL_ERROR, "message": "Internal error"}, actor=actor, worker=worker)
        return "failed"
    finally:
        monitor.stop()
    lifecycle.finish_run(task_id, result, worker=worker, to=eras.status_after_result(task.era, result))
    return "completed"
