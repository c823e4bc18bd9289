"""Running a tool: inline within a request, or as one run of a durable task.

A task run claims the task's lease, replays the answers recorded so far, calls
the tool, and records the outcome through ``lifecycle``. While the tool runs
the process's lease monitor (``leases``) renews the lease and watches for a
cancel, so the tool's context learns of a cancel within ``CANCEL_POLL_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from ..errors import INTERNAL_ERROR, HandOff, InputNeeded, InvalidParams, ProtocolError, TaskCancelled
from ..protocol import eras
from ..tasks import lifecycle
from ..telemetry import runs as run_telemetry
from ..tools.calls import tool_context
from ..tools.context import ToolContext
from ..tools.invoke import invoke
from ..tools.registry import Tool, registry
from ..tools.results import error_result, is_tool_error
from . import leases, progress

logger = logging.getLogger("mcptasks.execution")


# Task runs -----------------------------------------------------------------------


def worker_name() -> str:
    """Unique per run: a lease names the run that holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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
    status = progress.RunStatus(task_id, worker, cancel_event)
    ctx = tool_context(
        owner=task.owner,
        capabilities=task.client_capabilities,
        answers=run.answers,
        task_id=task_id,
        cancel_event=cancel_event,
        on_status=status.report,
        on_progress=status.report,
    )
    leases.monitor.watch(task_id, worker, cancel_event)
    try:
        kwargs = tool.validate_arguments(task.arguments)
        result = _invoke_reporting(tool, ctx, kwargs, status)
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
        leases.monitor.forget(worker)
    lifecycle.finish_run(task_id, result, worker=worker, to=eras.status_after_result(task.era, result))
    # The run's outcome for its span and metrics: a tool error is no success.
    return "tool_error" if is_tool_error(result) else "completed"


def _invoke_reporting(
    tool: Tool, ctx: ToolContext, kwargs: dict[str, Any], status: progress.RunStatus
) -> dict[str, Any]:
    """The tool's call. Its status reports end with it, so that none is
    written after the run's next durable write (input asked, outcome, or
    the cancel it saw)."""
    try:
        return invoke(tool, ctx, kwargs)
    finally:
        status.end()
